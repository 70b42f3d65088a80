// MACE's radial MLP (its hidden layers: matmul then SiLU, constants folded into the weights by
// cfmtrain/kernels/radial.py) on chunks of edges, each chunk's activations kept in the cache.
//
// Unfused, every layer streams an [edges, hidden] tensor through memory three times (the matmul's
// output, SiLU's input and output), and MKL runs the tall [edges x 64] @ [64 x 64] products at a
// fraction of its peak. Here each thread takes chunks of kRows edges and runs the whole net on
// them: the matmuls on [kRows x 64] tiles (common/gemm.h), SiLU in place; asked to, it also
// writes each layer's pre-activations z for the backward. The backward goes back through the
// layers chunk by chunk: d z = g * silu'(z), d a = d z @ W^T, and, when asked,
// d W += silu(z_prev)^T @ d z (per-thread sums).
// Python (cfmtrain/kernels/radial.py) holds the autograd around it (first order; a backward that
// builds a graph uses torch's ops).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "common/gemm.h"

namespace cfmtrain::radial {
namespace {

constexpr int64_t kRows = 512;  // edges per chunk: a 512 x 64 float32 tile is 128 KB

void check(const at::Tensor& x, at::TensorList weights) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "radial_mlp: x must be float32 or float64, got ", x.scalar_type());
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.dim() == 2,
              "radial_mlp: x must be a contiguous 2-D CPU tensor, got shape ", x.sizes());
  TORCH_CHECK(!weights.empty(), "radial_mlp: at least one layer");
  int64_t width = x.size(1);
  for (size_t l = 0; l < weights.size(); ++l) {
    const auto& w = weights[l];
    const std::string name = "weights[" + std::to_string(l) + "]";
    TORCH_CHECK(w.device().is_cpu() && w.is_contiguous() && w.dim() == 2 &&
                    w.scalar_type() == x.scalar_type(),
                "radial_mlp: ", name, " must be a contiguous 2-D CPU ", x.scalar_type(),
                " tensor");
    TORCH_CHECK(w.size(0) == width, "radial_mlp: ", name, " must have ", width, " rows, got ",
                w.size(0));
    width = w.size(1);
  }
}

bool worth_threads(int64_t rows) { return at::get_num_threads() > 1 && rows > 2 * kRows; }

// Per layer, the pre-activations z[l] = a[l-1] @ W[l] of the chunk's rows r0..r0+m (a[-1] = x):
// into the saved tensors when given, else into per-thread tiles; a[l] = silu(z[l]) into the
// tiles, the last one into the output rows.
void forward_chunk(const at::Tensor& x, at::TensorList weights,
                   const std::vector<at::Tensor>& saved, std::vector<at::Tensor>& tiles,
                   std::vector<at::Tensor>& a, const at::Tensor& out, int64_t r0, int64_t m) {
  const size_t n = weights.size();
  at::Tensor in = x.narrow(0, r0, m);
  for (size_t l = 0; l < n; ++l) {
    at::Tensor zl = saved.empty() ? tiles[l].narrow(0, 0, m) : saved[l].narrow(0, r0, m);
    gemm::mm_into(zl, in, weights[l], false);
    at::Tensor al = l + 1 == n ? out.narrow(0, r0, m) : a[l].narrow(0, 0, m);
    at::silu_out(al, zl);
    in = al;
  }
}

// The output and, with save_z, each layer's pre-activations (else an empty list).
std::tuple<at::Tensor, std::vector<at::Tensor>> forward(const at::Tensor& x,
                                                        at::TensorList weights, bool save_z) {
  check(x, weights);
  const int64_t rows = x.size(0), n = static_cast<int64_t>(weights.size());
  at::Tensor out = at::empty({rows, weights.back().size(1)}, x.options());
  std::vector<at::Tensor> saved;
  if (save_z)
    for (int64_t l = 0; l < n; ++l)
      saved.push_back(at::empty({rows, weights[l].size(1)}, x.options()));
  const int64_t chunks = (rows + kRows - 1) / kRows;
#pragma omp parallel num_threads(at::get_num_threads()) if (worth_threads(rows))
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    std::vector<at::Tensor> z, a;  // per-thread tiles (z only when not saved)
    for (int64_t l = 0; l < n; ++l) {
      if (!save_z) z.push_back(at::empty({kRows, weights[l].size(1)}, x.options()));
      a.push_back(at::empty({kRows, weights[l].size(1)}, x.options()));
    }
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t r0 = c * kRows, m = std::min(kRows, rows - r0);
      forward_chunk(x, weights, saved, z, a, out, r0, m);
    }
  }
  return {out, saved};
}

// d<grad, MLP(x)>/d x (when need_x) and /d W[l] for every layer (when need_weights), from the
// forward's saved pre-activations z.
std::tuple<at::Tensor, std::vector<at::Tensor>> backward(const at::Tensor& x,
                                                         at::TensorList weights, at::TensorList z,
                                                         const at::Tensor& grad, bool need_x,
                                                         bool need_weights) {
  check(x, weights);
  const int64_t rows = x.size(0), n = static_cast<int64_t>(weights.size());
  TORCH_CHECK(static_cast<int64_t>(z.size()) == n, "radial_mlp: z must hold one tensor per layer");
  for (int64_t l = 0; l < n; ++l)
    TORCH_CHECK(z[l].scalar_type() == x.scalar_type() && z[l].device().is_cpu() &&
                    z[l].is_contiguous() && z[l].dim() == 2 && z[l].size(0) == rows &&
                    z[l].size(1) == weights[l].size(1),
                "radial_mlp: z[", l, "] must be a contiguous [", rows, ", ", weights[l].size(1),
                "] ", x.scalar_type(), " tensor");
  TORCH_CHECK(grad.scalar_type() == x.scalar_type() && grad.device().is_cpu() &&
                  grad.is_contiguous() && grad.dim() == 2 && grad.size(0) == rows &&
                  grad.size(1) == weights.back().size(1),
              "radial_mlp: grad must be a contiguous CPU ", x.scalar_type(), " tensor of shape [",
              rows, ", ", weights.back().size(1), "], got ", grad.sizes());
  at::Tensor gx = need_x ? at::empty_like(x) : at::empty({0}, x.options());
  const int64_t chunks = (rows + kRows - 1) / kRows;
  const int64_t threads = worth_threads(rows) ? at::get_num_threads() : 1;
  std::vector<std::vector<at::Tensor>> sums(threads);  // per thread: d W[l]
  std::vector<at::Tensor> transposed;  // W[l]^T with contiguous rows, for the tiles' d a
  for (int64_t l = 0; l < n; ++l) transposed.push_back(weights[l].t().contiguous());
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    std::vector<at::Tensor> dw;
    int64_t width = 1;
    for (int64_t l = 0; l < n; ++l) {
      width = std::max(width, weights[l].size(1));
      if (need_weights) dw.push_back(at::zeros_like(weights[l]));
    }
    // d z and d a of the current layer, and silu(z) of the layer below (weight gradients)
    at::Tensor dz_tile = at::empty({kRows, width}, x.options());
    at::Tensor g_tile = at::empty({kRows, width}, x.options());
    at::Tensor a_tile = at::empty({kRows, width}, x.options());
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t r0 = c * kRows, m = std::min(kRows, rows - r0);
      at::Tensor g = grad.narrow(0, r0, m);
      for (int64_t l = n - 1; l >= 0; --l) {
        const int64_t k = weights[l].size(1);
        at::Tensor dz = dz_tile.narrow(0, 0, m).narrow(1, 0, k);
        at::silu_backward_out(dz, g, z[l].narrow(0, r0, m));  // g * silu'(z)
        if (need_weights) {
          at::Tensor in = x.narrow(0, r0, m);
          if (l > 0) {
            in = a_tile.narrow(0, 0, m).narrow(1, 0, weights[l].size(0));
            at::silu_out(in, z[l - 1].narrow(0, r0, m));
          }
          gemm::mm_into(dw[l], in.t(), dz, true);
        }
        if (l > 0) {
          at::Tensor gl = g_tile.narrow(0, 0, m).narrow(1, 0, weights[l].size(0));
          gemm::mm_into(gl, dz, transposed[l], false);
          g = gl;
        } else if (need_x) {
          at::Tensor gr = gx.narrow(0, r0, m);
          gemm::mm_into(gr, dz, transposed[0], false);
        }
      }
    }
    if (need_weights) sums[omp_get_thread_num()] = dw;
  }
  std::vector<at::Tensor> gw;
  if (need_weights) {
    for (int64_t l = 0; l < n; ++l) {
      at::Tensor total = at::zeros_like(weights[l]);
      for (const auto& s : sums)
        if (!s.empty()) total.add_(s[l]);
      gw.push_back(total);
    }
  }
  return {gx, gw};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cfmtrain, m) {
  m.def("radial_mlp(Tensor x, Tensor[] weights, bool save_z) -> (Tensor, Tensor[])");
  m.def(
      "radial_mlp_backward(Tensor x, Tensor[] weights, Tensor[] z, Tensor grad, bool need_x, "
      "bool need_weights) -> (Tensor, Tensor[])");
}

TORCH_LIBRARY_IMPL(cfmtrain, CPU, m) {
  m.impl("radial_mlp", &forward);
  m.impl("radial_mlp_backward", &backward);
}

}  // namespace cfmtrain::radial
