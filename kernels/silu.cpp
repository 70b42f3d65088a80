// The second derivative of SiLU, x * sigmoid(x), in one pass over the radial MLP's activations.
//
// A force-trained step differentiates each hidden activation twice: the forces' backward forms
// d silu = g * silu'(x), and the parameter gradient differentiates that again. torch's formula
// for it is a chain of element-wise ops over [edges, hidden] (about a dozen passes per layer);
// here one loop reads the incoming adjoint gg, the forces' adjoint g, x and s = sigmoid(x) and
// writes both derivatives of g * silu'(x):
//   d/dg = gg * silu'(x)      = gg * s * (1 + x * (1 - s))
//   d/dx = gg * g * silu''(x) = gg * g * s * (1 - s) * (2 + x * (1 - 2 * s))
// Python (cfmtrain/kernels/silu.py) holds the autograd around it.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <tuple>

namespace cfmtrain::silu {
namespace {

void check(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), "silu_grad_grad: ", name,
              " must be a contiguous CPU tensor");
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "silu_grad_grad: ", name, " must be ",
              like.scalar_type(), ", got ", t.scalar_type());
  TORCH_CHECK(t.sizes() == like.sizes(), "silu_grad_grad: ", name, " must have shape ",
              like.sizes(), ", got ", t.sizes());
}

template <typename T>
void kernel(const T* gg, const T* g, const T* x, const T* s, T* d_g, T* d_x, int64_t n) {
  at::parallel_for(0, n, 1 << 15, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const T si = s[i], xi = x[i], one_minus = T(1) - si;
      d_g[i] = gg[i] * si * (T(1) + xi * one_minus);
      d_x[i] = gg[i] * g[i] * si * one_minus * (T(2) + xi * (T(1) - T(2) * si));
    }
  });
}

std::tuple<at::Tensor, at::Tensor> silu_grad_grad(const at::Tensor& gg, const at::Tensor& grad,
                                                  const at::Tensor& x, const at::Tensor& s) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "silu_grad_grad: x must be float32 or float64, got ", x.scalar_type());
  check(x, "x", x);
  check(gg, "gg", x);
  check(grad, "grad", x);
  check(s, "s", x);
  at::Tensor d_g = at::empty_like(x), d_x = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "silu_grad_grad", [&] {
    kernel<scalar_t>(gg.data_ptr<scalar_t>(), grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                     s.data_ptr<scalar_t>(), d_g.data_ptr<scalar_t>(), d_x.data_ptr<scalar_t>(),
                     x.numel());
  });
  return {d_g, d_x};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cfmtrain, m) {
  m.def("silu_grad_grad(Tensor gg, Tensor grad, Tensor x, Tensor s) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(cfmtrain, CPU, m) { m.impl("silu_grad_grad", &silu_grad_grad); }

}  // namespace cfmtrain::silu
