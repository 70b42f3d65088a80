// Dense products a @ b of the kernels' weight paths (the conv's factored per-edge weights).
//
// float32 goes through oneDNN's matmul (torch's `mkldnn::_linear_pointwise`), which picks its
// kernels by the CPU's instruction set. MKL's sgemm, behind at::mm, takes its AVX2 code on AMD
// CPUs: on a Zen 5 with AVX-512, oneDNN ran the conv's [64-100 x 64] @ [64 x 512-1664] chunk
// products 1.2-2.0x faster on one thread, the tall ones 2.4x. float64 (no oneDNN matmul), or a
// torch without oneDNN or with it disabled (torch.backends.mkldnn), uses at::mm.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string_view>

namespace cfmtrain {

inline bool dense_mm_uses_onednn(const at::Tensor& a) {
  return a.scalar_type() == at::kFloat && at::hasMKLDNN() &&
         at::globalContext().userEnabledMkldnn();
}

// a [m, k] @ b [k, n] as a new contiguous [m, n] tensor (any strides in).
inline at::Tensor dense_mm(const at::Tensor& a, const at::Tensor& b) {
  if (!dense_mm_uses_onednn(a) || a.size(0) == 0 || a.size(1) == 0 || b.size(1) == 0)
    return at::mm(a, b);
  static const auto linear =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            std::string_view, c10::List<std::optional<at::Scalar>>,
                            std::optional<std::string_view>)>();
  // linear(x, w) = x @ w^T, with w of shape [out, in]
  return linear.call(a, b.t(), std::nullopt, "none", c10::List<std::optional<at::Scalar>>(),
                     std::nullopt);
}

// a @ b into the first m rows of `tile` (at::mm_out), or with oneDNN `tile` replaced by the
// product (it returns its own output): either way the product is `tile`'s first m rows.
inline void dense_mm_tile(at::Tensor& tile, const at::Tensor& a, const at::Tensor& b) {
  if (dense_mm_uses_onednn(a)) {
    tile = dense_mm(a, b);
  } else {
    at::Tensor rows = tile.narrow(0, 0, a.size(0));
    at::mm_out(rows, a, b);
  }
}

// acc += a @ b.
inline void dense_addmm_(at::Tensor& acc, const at::Tensor& a, const at::Tensor& b) {
  if (dense_mm_uses_onednn(a))
    acc.add_(dense_mm(a, b));
  else
    acc.addmm_(a, b);
}

}  // namespace cfmtrain
