// Registers the sparse-polynomial ops behind MACE's fused symmetric contraction: schemas, input
// checks and device dispatch. The work is in cpu/symmetric_contraction_cpu.cpp (CUDA: later).
//
// Three names share one schema and one kernel: `sparse_polynomial` (forward),
// `sparse_polynomial_backward` (a first derivative) and `sparse_polynomial_double_backward`
// (any higher derivative). Derivative descriptors are built in Python
// (cfmtrain.kernels.symmetric_contraction), which also registers autograd and fake kernels.
#include "common/sparse_polynomial.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

namespace cfmtrain {

namespace {

void check_index_tensor(const at::Tensor& t, const char* name, const char* op) {
  TORCH_CHECK(t.dim() == 1, op, ": `", name, "` must be 1-D, got shape ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kLong, op, ": `", name, "` must be int64, got ",
              t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), op, ": `", name, "` must be contiguous");
  TORCH_CHECK(t.device().is_cpu(), op, ": `", name, "` must be on the CPU (descriptor)");
}

// `t` is a contiguous int64 CPU vector (check_index_tensor): one pass, no allocation.
void check_range(const at::Tensor& t, int64_t upper, const char* name, const char* op) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const int64_t* v = t.data_ptr<int64_t>();
  int64_t lo = v[0], hi = v[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = v[i] < lo ? v[i] : lo;
    hi = v[i] > hi ? v[i] : hi;
  }
  TORCH_CHECK(lo >= 0 && hi < upper, op, ": `", name, "` values must lie in [0, ", upper,
              "), got [", lo, ", ", hi, "]");
}

void check_descriptor(const SparsePolynomialArgs& a, const char* op) {
  check_index_tensor(a.term_out, "term_out", op);
  check_index_tensor(a.factor_ptr, "factor_ptr", op);
  check_index_tensor(a.factor_op, "factor_op", op);
  check_index_tensor(a.factor_comp, "factor_comp", op);
  const int64_t T = a.term_out.numel();
  TORCH_CHECK(a.term_coeff.dim() == 1 && a.term_coeff.numel() == T &&
                  a.term_coeff.scalar_type() == at::kDouble && a.term_coeff.is_contiguous(),
              op, ": `term_coeff` must be a contiguous float64 vector of ", T, " terms");
  TORCH_CHECK(a.factor_ptr.numel() == T + 1, op, ": `factor_ptr` must hold ", T + 1,
              " offsets, got ", a.factor_ptr.numel());
  const int64_t F = a.factor_op.numel();
  TORCH_CHECK(a.factor_comp.numel() == F, op, ": `factor_comp` and `factor_op` differ in length");
  const auto* ptr = a.factor_ptr.data_ptr<int64_t>();
  TORCH_CHECK(ptr[0] == 0 && ptr[T] == F, op, ": `factor_ptr` must run from 0 to ", F);
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(ptr[t + 1] >= ptr[t], op, ": `factor_ptr` must be non-decreasing");
  }
  check_range(a.term_out, a.num_out, "term_out", op);
  const int64_t num_ops = static_cast<int64_t>(a.operands.size());
  check_range(a.factor_op, num_ops, "factor_op", op);
  const auto* fop = a.factor_op.data_ptr<int64_t>();
  const auto* fcomp = a.factor_comp.data_ptr<int64_t>();
  for (int64_t f = 0; f < F; ++f) {
    const int64_t dim = a.operands[fop[f]].size(1);
    TORCH_CHECK(fcomp[f] >= 0 && fcomp[f] < dim, op, ": factor ", f, " reads component ",
                fcomp[f], " of operand ", fop[f], " which has ", dim);
  }
}

void check_operands(const SparsePolynomialArgs& a, const char* op) {
  TORCH_CHECK(!a.operands.empty(), op, ": `operands` must not be empty");
  TORCH_CHECK(a.operand_per_elem.size() == a.operands.size(), op,
              ": `operand_per_elem` must have one entry per operand");
  const at::Tensor& first = a.operands[0];
  TORCH_CHECK(first.scalar_type() == at::kFloat || first.scalar_type() == at::kDouble, op,
              ": operands must be float32 or float64, got ", first.scalar_type());
  bool any_per_elem = a.out_per_elem;
  for (size_t o = 0; o < a.operands.size(); ++o) {
    const at::Tensor& x = a.operands[o];
    const std::string name = "operands[" + std::to_string(o) + "]";
    TORCH_CHECK(x.dim() == 3, op, ": `", name, "` must be (rows, components, channels), got ",
                x.sizes());
    TORCH_CHECK(x.is_contiguous(), op, ": `", name, "` must be contiguous");
    TORCH_CHECK(x.scalar_type() == first.scalar_type(), op, ": `", name, "` has dtype ",
                x.scalar_type(), " but operands[0] has ", first.scalar_type());
    TORCH_CHECK(x.device() == first.device(), op, ": `", name, "` is on ", x.device(),
                " but operands[0] is on ", first.device());
    TORCH_CHECK(x.size(2) == first.size(2), op, ": `", name, "` has ", x.size(2),
                " channels but operands[0] has ", first.size(2));
    const bool per_elem = a.operand_per_elem[o] != 0;
    any_per_elem = any_per_elem || per_elem;
    const int64_t rows = per_elem ? a.num_elems : a.num_rows;
    TORCH_CHECK(x.size(0) == rows, op, ": `", name, "` must have ", rows, " rows (",
                per_elem ? "num_elems" : "num_rows", "), got ", x.size(0));
  }
  if (any_per_elem) {
    TORCH_CHECK(a.elem.has_value(), op, ": `elem` is required with per-element operands");
    check_index_tensor(*a.elem, "elem", op);
    TORCH_CHECK(a.elem->numel() == a.num_rows, op, ": `elem` must have num_rows = ",
                a.num_rows, " entries, got ", a.elem->numel());
    check_range(*a.elem, a.num_elems, "elem", op);
  }
  TORCH_CHECK(a.num_out >= 0 && a.num_rows >= 0 && a.num_elems >= 0, op,
              ": sizes must be non-negative");
}

at::Tensor dispatch(const char* op, at::TensorList operands,
                    c10::IntArrayRef operand_per_elem, const c10::optional<at::Tensor>& elem,
                    const at::Tensor& term_out, const at::Tensor& term_coeff,
                    const at::Tensor& factor_ptr, const at::Tensor& factor_op,
                    const at::Tensor& factor_comp, int64_t num_out, int64_t num_rows,
                    int64_t num_elems, bool out_per_elem) {
  SparsePolynomialArgs a;
  a.operands = operands.vec();
  a.operand_per_elem = operand_per_elem.vec();
  a.elem = elem;
  a.term_out = term_out;
  a.term_coeff = term_coeff;
  a.factor_ptr = factor_ptr;
  a.factor_op = factor_op;
  a.factor_comp = factor_comp;
  a.num_out = num_out;
  a.num_rows = num_rows;
  a.num_elems = num_elems;
  a.out_per_elem = out_per_elem;
  check_sparse_polynomial_args(a, op);
  const at::Device device = a.operands[0].device();
  if (device.is_cpu()) return sparse_polynomial_cpu(a);
  // CUDA kernels come later (kernels/cuda/README.md); the Python backend never routes here.
  TORCH_CHECK(false, op, ": no kernel for device ", device, " yet (CPU only)");
}

#define CFMTRAIN_SPARSE_POLY_ENTRY(NAME)                                                      \
  at::Tensor NAME##_impl(at::TensorList operands, c10::IntArrayRef operand_per_elem,         \
                         const c10::optional<at::Tensor>& elem, const at::Tensor& term_out,   \
                         const at::Tensor& term_coeff, const at::Tensor& factor_ptr,          \
                         const at::Tensor& factor_op, const at::Tensor& factor_comp,          \
                         int64_t num_out, int64_t num_rows, int64_t num_elems,                \
                         bool out_per_elem, int64_t desc_id) {                                \
    (void)desc_id;                                                                           \
    return dispatch(#NAME, operands, operand_per_elem, elem, term_out, term_coeff,           \
                    factor_ptr, factor_op, factor_comp, num_out, num_rows, num_elems,         \
                    out_per_elem);                                                            \
  }

CFMTRAIN_SPARSE_POLY_ENTRY(sparse_polynomial)
CFMTRAIN_SPARSE_POLY_ENTRY(sparse_polynomial_backward)
CFMTRAIN_SPARSE_POLY_ENTRY(sparse_polynomial_double_backward)

#undef CFMTRAIN_SPARSE_POLY_ENTRY

constexpr const char* kArgs =
    "(Tensor[] operands, int[] operand_per_elem, Tensor? elem, Tensor term_out, "
    "Tensor term_coeff, Tensor factor_ptr, Tensor factor_op, Tensor factor_comp, int num_out, "
    "int num_rows, int num_elems, bool out_per_elem, int desc_id) -> Tensor";

}  // namespace

void check_sparse_polynomial_args(const SparsePolynomialArgs& a, const char* op_name) {
  check_operands(a, op_name);
  check_descriptor(a, op_name);
}

TORCH_LIBRARY_FRAGMENT(cfmtrain, m) {
  m.def((std::string("sparse_polynomial") + kArgs).c_str());
  m.def((std::string("sparse_polynomial_backward") + kArgs).c_str());
  m.def((std::string("sparse_polynomial_double_backward") + kArgs).c_str());
}

// One implementation for every device key: the entry checks inputs and dispatches on device.
TORCH_LIBRARY_IMPL(cfmtrain, CPU, m) {
  m.impl("sparse_polynomial", &sparse_polynomial_impl);
  m.impl("sparse_polynomial_backward", &sparse_polynomial_backward_impl);
  m.impl("sparse_polynomial_double_backward", &sparse_polynomial_double_backward_impl);
}

}  // namespace cfmtrain
