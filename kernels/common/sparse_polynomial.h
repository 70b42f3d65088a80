// Sparse polynomial over channel-contiguous operands: the interface shared by the CPU kernel,
// the op registration (kernels/symmetric_contraction.cpp) and any op that reuses it.
//
// A descriptor is a list of terms; term t adds coeff[t] * prod_f operand[op_f][row, comp_f, c]
// to out[row', out[t], c] for every row (node) and channel c. An operand's row is the node
// itself, or elem[node] when the operand is "per element" (weights chosen by element index).
// The output is per node (num_rows, num_out, C) or, when out_per_elem, summed over the nodes
// of each element (num_elems, num_out, C). Derivatives of such a polynomial are polynomials of
// the same kind, so forward, backward and double backward all run this one kernel.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <vector>

namespace cfmtrain {

struct SparsePolynomialArgs {
  std::vector<at::Tensor> operands;      // each (rows_o, dim_o, C), contiguous, same dtype
  std::vector<int64_t> operand_per_elem;  // 1: operand rows are indexed by elem[node]
  c10::optional<at::Tensor> elem;        // (num_rows,) int64 element index per node
  at::Tensor term_out;                   // (T,) int64 output component of each term
  at::Tensor term_coeff;                 // (T,) float64 coefficient
  at::Tensor factor_ptr;                 // (T + 1,) int64 offsets into the factor lists
  at::Tensor factor_op;                  // (F,) int64 operand of each factor
  at::Tensor factor_comp;                // (F,) int64 component of each factor
  int64_t num_out = 0;
  int64_t num_rows = 0;
  int64_t num_elems = 0;
  bool out_per_elem = false;
};

// Checks every argument (shapes, dtypes, index ranges) and throws naming the bad one.
void check_sparse_polynomial_args(const SparsePolynomialArgs& args, const char* op_name);

// Evaluates the polynomial on CPU (OpenMP over nodes, SIMD over channels).
at::Tensor sparse_polynomial_cpu(const SparsePolynomialArgs& args);

}  // namespace cfmtrain
