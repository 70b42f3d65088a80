// cfmtrain::dense_mm(a, b) = a @ b for the fused ops' float32 products under 1 GFLOP (the radial
// MLP's layers, the fused linear, small deferred contractions; cfmtrain/kernels/dense.py sends
// larger ones to oneDNN), on the AVX-512 product of common/gemm.h where the CPU runs it, split
// over torch's threads; elsewhere, and for float64, at::mm. Python holds the autograd around it.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <string>

#include "common/gemm.h"

namespace cfmtrain::dense {
namespace {

at::Tensor dense_mm(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "dense_mm: a and b must be 2-D, got shapes ",
              a.sizes(), " and ", b.sizes());
  TORCH_CHECK(a.size(1) == b.size(0), "dense_mm: a [", a.size(0), ", ", a.size(1),
              "] and b [", b.size(0), ", ", b.size(1), "] do not chain");
  TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu(), "dense_mm: CPU tensors only");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "dense_mm: a is ", a.scalar_type(),
              " but b is ", b.scalar_type());
  if (a.scalar_type() != at::kFloat || !gemm::gemm_available()) return at::mm(a, b);
#ifdef CFMTRAIN_GEMM_AVX512
  const at::Tensor bc = b.stride(1) == 1 ? b : b.contiguous();
  const int64_t m = a.size(0), n = b.size(1), k = a.size(1);
  at::Tensor c = at::empty({m, n}, a.options());
  const gemm::Operand A{a.data_ptr<float>(), a.stride(0), a.stride(1)};
  const float* bp = bc.data_ptr<float>();
  float* cp = c.data_ptr<float>();
  const int64_t ldb = bc.stride(0);
  if (m >= n) {  // threads take slices of rows (whole kMR blocks)
    const int64_t units = (m + gemm::kMR - 1) / gemm::kMR;
    at::parallel_for(0, units, 1, [&](int64_t u0, int64_t u1) {
      const int64_t i0 = u0 * gemm::kMR, i1 = std::min(m, u1 * gemm::kMR);
      gemm::gemm(i1 - i0, n, k, {A.a + i0 * A.a_rs, A.a_rs, A.a_cs}, bp, ldb, cp + i0 * n, n,
                 false);
    });
  } else {  // wide: threads take slices of columns (whole kNR blocks), each reading its part of b
    const int64_t units = (n + gemm::kNR - 1) / gemm::kNR;
    at::parallel_for(0, units, 1, [&](int64_t u0, int64_t u1) {
      const int64_t j0 = u0 * gemm::kNR, j1 = std::min(n, u1 * gemm::kNR);
      gemm::gemm(m, j1 - j0, k, A, bp + j0, ldb, cp + j0, n, false);
    });
  }
  return c;
#else
  return at::mm(a, b);
#endif
}

// "avx512" where dense_mm and the conv's chunk products take the AVX-512 product, else "aten".
std::string dense_mm_backend() { return gemm::gemm_available() ? "avx512" : "aten"; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(cfmtrain, m) {
  m.def("dense_mm(Tensor a, Tensor b) -> Tensor");
  m.def("dense_mm_backend() -> str", &dense_mm_backend);
}

TORCH_LIBRARY_IMPL(cfmtrain, CPU, m) { m.impl("dense_mm", &dense_mm); }

}  // namespace cfmtrain::dense
