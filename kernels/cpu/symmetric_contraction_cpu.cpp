// CPU kernel of the sparse polynomial behind the fused symmetric contraction (and its
// derivatives): OpenMP over nodes, SIMD over the contiguous channel axis.
#include "../common/sparse_polynomial.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace cfmtrain {
namespace {

// The descriptor unpacked once per call into flat arrays the inner loop reads.
template <typename T>
struct Program {
  std::vector<int64_t> out_offset;  // out[t] * C
  std::vector<T> coeff;
  std::vector<int32_t> num_factors;
  std::vector<int64_t> factor_begin;
  std::vector<int32_t> factor_op;
  std::vector<int64_t> factor_offset;  // comp * C
};

template <typename T>
Program<T> unpack(const SparsePolynomialArgs& a, int64_t C) {
  Program<T> p;
  const int64_t T_ = a.term_out.numel();
  const auto* out = a.term_out.data_ptr<int64_t>();
  const auto* coeff = a.term_coeff.data_ptr<double>();
  const auto* ptr = a.factor_ptr.data_ptr<int64_t>();
  const auto* op = a.factor_op.data_ptr<int64_t>();
  const auto* comp = a.factor_comp.data_ptr<int64_t>();
  p.out_offset.resize(T_);
  p.coeff.resize(T_);
  p.num_factors.resize(T_);
  p.factor_begin.resize(T_);
  for (int64_t t = 0; t < T_; ++t) {
    p.out_offset[t] = out[t] * C;
    p.coeff[t] = static_cast<T>(coeff[t]);
    p.num_factors[t] = static_cast<int32_t>(ptr[t + 1] - ptr[t]);
    p.factor_begin[t] = ptr[t];
  }
  const int64_t F = a.factor_op.numel();
  p.factor_op.resize(F);
  p.factor_offset.resize(F);
  for (int64_t f = 0; f < F; ++f) {
    p.factor_op[f] = static_cast<int32_t>(op[f]);
    p.factor_offset[f] = comp[f] * C;
  }
  return p;
}

// SIMD vectors of 32 bytes (AVX2) through GCC/Clang vector extensions; unaligned loads.
template <typename T>
struct Simd;
template <>
struct Simd<float> {
  typedef float type __attribute__((vector_size(32), aligned(4)));
  static constexpr int lanes = 8;
};
template <>
struct Simd<double> {
  typedef double type __attribute__((vector_size(32), aligned(8)));
  static constexpr int lanes = 4;
};

// acc[v] += s * prod_j p[j][v]: one term on a block of V vectors, NF factors.
template <typename T, int V, int NF>
inline void add_term(typename Simd<T>::type* acc, const T* const* p, T s) {
  using vec = typename Simd<T>::type;
  constexpr int L = Simd<T>::lanes;
  vec tmp[V];
  for (int v = 0; v < V; ++v) tmp[v] = s * *reinterpret_cast<const vec*>(p[0] + L * v);
  for (int j = 1; j < NF; ++j) {
    for (int v = 0; v < V; ++v) tmp[v] *= *reinterpret_cast<const vec*>(p[j] + L * v);
  }
  for (int v = 0; v < V; ++v) acc[v] += tmp[v];
}

template <typename T, int V>
inline void add_term_any(typename Simd<T>::type* acc, const T* const* p, int nf, T s) {
  switch (nf) {
    case 1: add_term<T, V, 1>(acc, p, s); return;
    case 2: add_term<T, V, 2>(acc, p, s); return;
    case 3: add_term<T, V, 3>(acc, p, s); return;
    case 4: add_term<T, V, 4>(acc, p, s); return;
    case 5: add_term<T, V, 5>(acc, p, s); return;
    case 6: add_term<T, V, 6>(acc, p, s); return;
    default: {
      using vec = typename Simd<T>::type;
      constexpr int L = Simd<T>::lanes;
      for (int v = 0; v < V; ++v) {
        vec t = s * *reinterpret_cast<const vec*>(p[0] + L * v);
        for (int j = 1; j < nf; ++j) t *= *reinterpret_cast<const vec*>(p[j] + L * v);
        acc[v] += t;
      }
    }
  }
}

template <typename T>
struct Operands {
  std::vector<const T*> data;
  std::vector<int64_t> row_stride;
  std::vector<char> per_elem;
};

// Float32 runs are summed in chunks of kChunk terms in float32, the chunks in float64: the
// error of a long float32 sum drops ~2.5x (below mace-torch's own) for ~20% more time.
constexpr int kChunk = 8;

template <typename T>
struct Wide {  // the accumulator for a run of terms: T itself, float64 for float32
  using type = typename Simd<T>::type;
  static constexpr int per_vec = 1;
};
template <>
struct Wide<float> {
  typedef double type __attribute__((vector_size(32), aligned(8)));
  static constexpr int per_vec = 2;
};

// wide += acc (and acc = 0 for float32, whose chunk has been moved into `wide`).
template <typename T, int V>
inline void widen(typename Wide<T>::type* wide, typename Simd<T>::type* acc) {
  using vec = typename Simd<T>::type;
  if constexpr (std::is_same_v<T, float>) {
    typedef float half __attribute__((vector_size(16), aligned(4)));
    using wvec = typename Wide<T>::type;
    for (int v = 0; v < V; ++v) {
      const half lo = {acc[v][0], acc[v][1], acc[v][2], acc[v][3]};
      const half hi = {acc[v][4], acc[v][5], acc[v][6], acc[v][7]};
      wide[2 * v] += __builtin_convertvector(lo, wvec);
      wide[2 * v + 1] += __builtin_convertvector(hi, wvec);
      acc[v] = vec{};
    }
  } else {
    for (int v = 0; v < V; ++v) {
      wide[v] += acc[v];
      acc[v] = vec{};
    }
  }
}

// o[c] += wide[c] for one block, converted to the output rows' type O.
template <typename T, typename O, int V>
inline void flush(O* __restrict o, const typename Wide<T>::type* wide) {
  constexpr int W = V * Wide<T>::per_vec;
  constexpr int L = Simd<T>::lanes / Wide<T>::per_vec;
  for (int v = 0; v < W; ++v) {
    for (int l = 0; l < L; ++l) o[L * v + l] += static_cast<O>(wide[v][l]);
  }
}

// Adds every term of one node to its output rows (num_out x C) for channels [c0, c0 + V*L):
// terms are sorted by output, so each run of equal outputs accumulates in registers.
template <typename T, typename O, int V>
inline void eval_block(const Program<T>& prog, const T* const* rows, O* __restrict orow,
                       int64_t c0) {
  using vec = typename Simd<T>::type;
  using wvec = typename Wide<T>::type;
  constexpr int W = V * Wide<T>::per_vec;
  const T* ptrs[16];
  const int64_t num_terms = static_cast<int64_t>(prog.coeff.size());
  int64_t t = 0;
  while (t < num_terms) {
    const int64_t out = prog.out_offset[t];
    vec acc[V];
    wvec wide[W];
    for (int v = 0; v < V; ++v) acc[v] = vec{};
    for (int v = 0; v < W; ++v) wide[v] = wvec{};
    int in_chunk = 0;
    for (; t < num_terms && prog.out_offset[t] == out; ++t) {
      const int nf = prog.num_factors[t];
      const int64_t f0 = prog.factor_begin[t];
      for (int j = 0; j < nf; ++j) {
        ptrs[j] = rows[prog.factor_op[f0 + j]] + prog.factor_offset[f0 + j] + c0;
      }
      add_term_any<T, V>(acc, ptrs, nf, prog.coeff[t]);
      if (++in_chunk == kChunk) {
        widen<T, V>(wide, acc);
        in_chunk = 0;
      }
    }
    widen<T, V>(wide, acc);
    flush<T, O, V>(orow + out + c0, wide);
  }
}

// Channels not covered by whole vectors (fewer than one vector's lanes): plain loops, each
// run of equal outputs summed in float64.
template <typename T, typename O>
inline void eval_tail(const Program<T>& prog, const T* const* rows, O* __restrict orow,
                      int64_t c0, int64_t C) {
  const int64_t num_terms = static_cast<int64_t>(prog.coeff.size());
  double wide[Simd<T>::lanes];
  int64_t t = 0;
  while (t < num_terms) {
    const int64_t out = prog.out_offset[t];
    std::fill(wide, wide + (C - c0), 0.0);
    for (; t < num_terms && prog.out_offset[t] == out; ++t) {
      const int64_t f0 = prog.factor_begin[t];
      for (int64_t c = c0; c < C; ++c) {
        T prod = prog.coeff[t];
        for (int j = 0; j < prog.num_factors[t]; ++j) {
          prod *= rows[prog.factor_op[f0 + j]][prog.factor_offset[f0 + j] + c];
        }
        wide[c - c0] += prod;
      }
    }
    for (int64_t c = c0; c < C; ++c) orow[out + c] += static_cast<O>(wide[c - c0]);
  }
}

// One node, all channels: blocks of 8, 4 and 1 vectors, then the scalar tail.
template <typename T, typename O>
inline void eval_node(const Program<T>& prog, const T* const* rows, O* orow, int64_t C) {
  constexpr int L = Simd<T>::lanes;
  int64_t c0 = 0;
  for (; c0 + 8 * L <= C; c0 += 8 * L) eval_block<T, O, 8>(prog, rows, orow, c0);
  for (; c0 + 4 * L <= C; c0 += 4 * L) eval_block<T, O, 4>(prog, rows, orow, c0);
  for (; c0 + L <= C; c0 += L) eval_block<T, O, 1>(prog, rows, orow, c0);
  if (c0 < C) eval_tail<T, O>(prog, rows, orow, c0, C);
}

// Threads for a call: one for small work (a parallel region costs more than it saves).
template <typename T>
int threads_for(int64_t rows, const Program<T>& prog, int64_t C) {
  const int64_t work = rows * static_cast<int64_t>(prog.factor_op.size()) * C;
  if (work < (int64_t(1) << 18)) return 1;
  return std::max(1, std::min<int>(at::get_num_threads(), static_cast<int>(rows)));
}

template <typename T>
Operands<T> gather_operands(const SparsePolynomialArgs& a, int64_t C) {
  Operands<T> ops;
  for (size_t o = 0; o < a.operands.size(); ++o) {
    ops.data.push_back(a.operands[o].data_ptr<T>());
    ops.row_stride.push_back(a.operands[o].size(1) * C);
    ops.per_elem.push_back(a.operand_per_elem[o] != 0);
  }
  return ops;
}

template <typename T>
inline void set_rows(const Operands<T>& ops, const int64_t* elem, int64_t n, const T** rows) {
  for (size_t o = 0; o < ops.data.size(); ++o) {
    rows[o] = ops.data[o] + (ops.per_elem[o] ? elem[n] : n) * ops.row_stride[o];
  }
}

// Per-node output: each node's rows are written by the thread that owns the node.
template <typename T>
void run_per_node(const SparsePolynomialArgs& a, const Program<T>& prog, at::Tensor& out,
                  int64_t C) {
  const Operands<T> ops = gather_operands<T>(a, C);
  const int64_t* elem = a.elem.has_value() ? a.elem->data_ptr<int64_t>() : nullptr;
  const int64_t N = a.num_rows, row_size = a.num_out * C;
  T* out_data = out.data_ptr<T>();
  const int num_threads = threads_for(N, prog, C);
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<const T*> rows(ops.data.size());
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      T* orow = out_data + n * row_size;
      std::fill(orow, orow + row_size, T(0));
      set_rows<T>(ops, elem, n, rows.data());
      eval_node<T, T>(prog, rows.data(), orow, C);
    }
  }
}

// Per-element output (a sum over the nodes of each element): private float64 accumulators
// per thread, so long sums over nodes keep their precision in float32, added up at the end.
template <typename T>
void run_per_elem(const SparsePolynomialArgs& a, const Program<T>& prog, at::Tensor& out,
                  int64_t C) {
  const Operands<T> ops = gather_operands<T>(a, C);
  const int64_t* elem = a.elem->data_ptr<int64_t>();
  const int64_t N = a.num_rows, row_size = a.num_out * C;
  T* out_data = out.data_ptr<T>();
  const int num_threads = threads_for(N, prog, C);
  const int64_t out_size = out.numel();
  std::vector<double> partial(size_t(num_threads) * out_size, 0.0);
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<const T*> rows(ops.data.size());
    double* own = partial.data() + size_t(omp_get_thread_num()) * out_size;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      set_rows<T>(ops, elem, n, rows.data());
      eval_node<T, double>(prog, rows.data(), own + elem[n] * row_size, C);
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < out_size; ++i) {
      double sum = 0;
      for (int th = 0; th < num_threads; ++th) sum += partial[size_t(th) * out_size + i];
      out_data[i] = static_cast<T>(sum);
    }
  }
}

template <typename T>
void run(const SparsePolynomialArgs& a, at::Tensor& out, int64_t C) {
  const Program<T> prog = unpack<T>(a, C);
  for (int32_t nf : prog.num_factors) {
    TORCH_CHECK(nf >= 1 && nf <= 16, "sparse_polynomial: a term has ", nf,
                " factors (1 to 16 supported)");
  }
  if (a.out_per_elem) {
    run_per_elem<T>(a, prog, out, C);
  } else {
    run_per_node<T>(a, prog, out, C);
  }
}

}  // namespace

at::Tensor sparse_polynomial_cpu(const SparsePolynomialArgs& a) {
  const at::Tensor& first = a.operands.at(0);
  const int64_t C = first.size(2);
  const int64_t rows = a.out_per_elem ? a.num_elems : a.num_rows;
  at::Tensor out = a.out_per_elem || a.num_rows == 0 || a.term_out.numel() == 0
                       ? at::zeros({rows, a.num_out, C}, first.options())
                       : at::empty({rows, a.num_out, C}, first.options());
  if (a.num_rows == 0 || a.term_out.numel() == 0 || C == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(first.scalar_type(), "sparse_polynomial_cpu",
                             [&] { run<scalar_t>(a, out, C); });
  return out;
}

}  // namespace cfmtrain
