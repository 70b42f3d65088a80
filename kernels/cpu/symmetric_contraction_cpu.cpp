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

// The descriptor unpacked once per call into the grouped form the inner loop reads. Each term's
// factors are sorted by (operand, component); the last two form its pair (a single factor pairs
// with the ones row), the others its prefix. Terms with the same output, factor count and prefix
// make one group, which adds (prod prefix) * sum over its pairs of coeff * a * b: the prefix
// product is formed once per group instead of once per term.
template <typename T>
struct Program {
  std::vector<int64_t> group_out;     // out * C per group, groups sorted by output
  std::vector<int64_t> group_prefix;  // (G + 1) offsets into prefix_op / prefix_offset
  std::vector<int64_t> group_pairs;   // (G + 1) offsets into the pair arrays
  std::vector<int32_t> prefix_op;
  std::vector<int64_t> prefix_offset;  // comp * C
  std::vector<int32_t> pair_op[2];     // an operand, or the number of operands: the ones row
  std::vector<int64_t> pair_offset[2];
  std::vector<T> pair_coeff;
  int64_t num_factors = 0;  // factors over all terms (the threading heuristic's work measure)
};

template <typename T>
Program<T> unpack(const SparsePolynomialArgs& a, int64_t C) {
  const int64_t num_terms = a.term_out.numel();
  const auto* out = a.term_out.data_ptr<int64_t>();
  const auto* coeff = a.term_coeff.data_ptr<double>();
  const auto* ptr = a.factor_ptr.data_ptr<int64_t>();
  const auto* op = a.factor_op.data_ptr<int64_t>();
  const auto* comp = a.factor_comp.data_ptr<int64_t>();
  const int64_t ones = static_cast<int64_t>(a.operands.size());
  std::vector<std::vector<std::pair<int64_t, int64_t>>> factors(num_terms);
  for (int64_t t = 0; t < num_terms; ++t) {
    const int64_t nf = ptr[t + 1] - ptr[t];
    TORCH_CHECK(nf >= 1 && nf <= 16, "sparse_polynomial: a term has ", nf,
                " factors (1 to 16 supported)");
    for (int64_t f = ptr[t]; f < ptr[t + 1]; ++f) factors[t].emplace_back(op[f], comp[f]);
    std::sort(factors[t].begin(), factors[t].end());
    if (nf == 1) factors[t].emplace_back(ones, 0);
  }
  auto prefix_end = [&](int64_t t) { return factors[t].end() - 2; };
  auto key_less = [&](int64_t s, int64_t t) {
    if (out[s] != out[t]) return out[s] < out[t];
    if (factors[s].size() != factors[t].size()) return factors[s].size() < factors[t].size();
    return std::lexicographical_compare(factors[s].begin(), prefix_end(s), factors[t].begin(),
                                        prefix_end(t));
  };
  std::vector<int64_t> order(num_terms);
  for (int64_t t = 0; t < num_terms; ++t) order[t] = t;
  std::stable_sort(order.begin(), order.end(), key_less);
  Program<T> p;
  p.num_factors = a.factor_op.numel();
  for (int64_t i = 0; i < num_terms; ++i) {
    const int64_t t = order[i];
    if (i == 0 || key_less(order[i - 1], t)) {  // a new key starts a group
      p.group_prefix.push_back(static_cast<int64_t>(p.prefix_op.size()));
      p.group_pairs.push_back(static_cast<int64_t>(p.pair_coeff.size()));
      p.group_out.push_back(out[t] * C);
      for (auto f = factors[t].begin(); f != prefix_end(t); ++f) {
        p.prefix_op.push_back(static_cast<int32_t>(f->first));
        p.prefix_offset.push_back(f->second * C);
      }
    }
    for (int k = 0; k < 2; ++k) {
      const auto& f = *(prefix_end(t) + k);
      p.pair_op[k].push_back(static_cast<int32_t>(f.first));
      p.pair_offset[k].push_back(f.second * C);
    }
    p.pair_coeff.push_back(static_cast<T>(coeff[t]));
  }
  p.group_prefix.push_back(static_cast<int64_t>(p.prefix_op.size()));
  p.group_pairs.push_back(static_cast<int64_t>(p.pair_coeff.size()));
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

// Adds every group of `num_nodes` nodes to one output block (num_out x C) for channels
// [c0, c0 + V*L): node k's operand rows are rows[k * stride + operand]. Groups are sorted by
// output, so each output's sum (over groups and nodes) accumulates in registers.
template <typename T, typename O, int V>
inline void eval_block(const Program<T>& prog, const T* const* rows, int num_nodes,
                       int stride, O* __restrict orow, int64_t c0) {
  using vec = typename Simd<T>::type;
  using wvec = typename Wide<T>::type;
  constexpr int L = Simd<T>::lanes;
  constexpr int W = V * Wide<T>::per_vec;
  const int64_t num_groups = static_cast<int64_t>(prog.group_out.size());
  int64_t g = 0;
  while (g < num_groups) {
    const int64_t out = prog.group_out[g];
    vec acc[V];
    wvec wide[W];
    for (int v = 0; v < V; ++v) acc[v] = vec{};
    for (int v = 0; v < W; ++v) wide[v] = wvec{};
    int64_t in_chunk = 0;
    for (; g < num_groups && prog.group_out[g] == out; ++g) {
      const int64_t q0 = prog.group_pairs[g], q1 = prog.group_pairs[g + 1];
      const int64_t f0 = prog.group_prefix[g], f1 = prog.group_prefix[g + 1];
      for (int k = 0; k < num_nodes; ++k) {
        const T* const* r = rows + k * stride;
        vec inner[V];
        for (int v = 0; v < V; ++v) inner[v] = vec{};
        for (int64_t q = q0; q < q1; ++q) {
          const T* x = r[prog.pair_op[0][q]] + prog.pair_offset[0][q] + c0;
          const T* y = r[prog.pair_op[1][q]] + prog.pair_offset[1][q] + c0;
          const T s = prog.pair_coeff[q];
          for (int v = 0; v < V; ++v) {
            inner[v] += (s * *reinterpret_cast<const vec*>(x + L * v)) *
                        *reinterpret_cast<const vec*>(y + L * v);
          }
        }
        for (int64_t f = f0; f < f1; ++f) {
          const T* x = r[prog.prefix_op[f]] + prog.prefix_offset[f] + c0;
          for (int v = 0; v < V; ++v) inner[v] *= *reinterpret_cast<const vec*>(x + L * v);
        }
        for (int v = 0; v < V; ++v) acc[v] += inner[v];
      }
      in_chunk += num_nodes * (q1 - q0);
      if (in_chunk >= kChunk) {
        widen<T, V>(wide, acc);
        in_chunk = 0;
      }
    }
    widen<T, V>(wide, acc);
    flush<T, O, V>(orow + out + c0, wide);
  }
}

// Channels not covered by whole vectors (fewer than one vector's lanes): plain loops, each
// output's sum in float64.
template <typename T, typename O>
inline void eval_tail(const Program<T>& prog, const T* const* rows, int num_nodes, int stride,
                      O* __restrict orow, int64_t c0, int64_t C) {
  const int64_t num_groups = static_cast<int64_t>(prog.group_out.size());
  double wide[Simd<T>::lanes];
  int64_t g = 0;
  while (g < num_groups) {
    const int64_t out = prog.group_out[g];
    std::fill(wide, wide + (C - c0), 0.0);
    for (; g < num_groups && prog.group_out[g] == out; ++g) {
      for (int k = 0; k < num_nodes; ++k) {
        const T* const* r = rows + k * stride;
        for (int64_t c = c0; c < C; ++c) {
          T inner = 0;
          for (int64_t q = prog.group_pairs[g]; q < prog.group_pairs[g + 1]; ++q) {
            inner += prog.pair_coeff[q] * r[prog.pair_op[0][q]][prog.pair_offset[0][q] + c] *
                     r[prog.pair_op[1][q]][prog.pair_offset[1][q] + c];
          }
          for (int64_t f = prog.group_prefix[g]; f < prog.group_prefix[g + 1]; ++f) {
            inner *= r[prog.prefix_op[f]][prog.prefix_offset[f] + c];
          }
          wide[c - c0] += inner;
        }
      }
    }
    for (int64_t c = c0; c < C; ++c) orow[out + c] += static_cast<O>(wide[c - c0]);
  }
}

// Nodes sharing one output block, all channels: blocks of 8, 4 and 1 vectors, then the tail.
template <typename T, typename O>
inline void eval_nodes(const Program<T>& prog, const T* const* rows, int num_nodes, int stride,
                       O* orow, int64_t C) {
  constexpr int L = Simd<T>::lanes;
  int64_t c0 = 0;
  for (; c0 + 8 * L <= C; c0 += 8 * L)
    eval_block<T, O, 8>(prog, rows, num_nodes, stride, orow, c0);
  for (; c0 + 4 * L <= C; c0 += 4 * L)
    eval_block<T, O, 4>(prog, rows, num_nodes, stride, orow, c0);
  for (; c0 + L <= C; c0 += L) eval_block<T, O, 1>(prog, rows, num_nodes, stride, orow, c0);
  if (c0 < C) eval_tail<T, O>(prog, rows, num_nodes, stride, orow, c0, C);
}

// Threads for a call: one for small work (a parallel region costs more than it saves).
template <typename T>
int threads_for(int64_t rows, const Program<T>& prog, int64_t C) {
  const int64_t work = rows * prog.num_factors * C;
  if (work < (int64_t(1) << 18)) return 1;
  return std::max(1, std::min<int>(at::get_num_threads(), static_cast<int>(rows)));
}

// Operand rows of one node, followed by the ones row (the second factor of single-factor terms).
template <typename T>
struct Operands {
  std::vector<const T*> data;
  std::vector<int64_t> row_stride;
  std::vector<char> per_elem;
  std::vector<T> ones;

  Operands(const SparsePolynomialArgs& a, int64_t C) : ones(C, T(1)) {
    for (size_t o = 0; o < a.operands.size(); ++o) {
      data.push_back(a.operands[o].data_ptr<T>());
      row_stride.push_back(a.operands[o].size(1) * C);
      per_elem.push_back(a.operand_per_elem[o] != 0);
    }
  }
  int stride() const { return static_cast<int>(data.size()) + 1; }
  void set_rows(const int64_t* elem, int64_t n, const T** rows) const {
    for (size_t o = 0; o < data.size(); ++o) {
      rows[o] = data[o] + (per_elem[o] ? elem[n] : n) * row_stride[o];
    }
    rows[data.size()] = ones.data();
  }
};

// Per-node output: each node's rows are written by the thread that owns the node.
template <typename T>
void run_per_node(const SparsePolynomialArgs& a, const Program<T>& prog, at::Tensor& out,
                  int64_t C) {
  const Operands<T> ops(a, C);
  const int64_t* elem = a.elem.has_value() ? a.elem->data_ptr<int64_t>() : nullptr;
  const int64_t N = a.num_rows, row_size = a.num_out * C;
  T* out_data = out.data_ptr<T>();
  const int num_threads = threads_for(N, prog, C);
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<const T*> rows(ops.stride());
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      T* orow = out_data + n * row_size;
      std::fill(orow, orow + row_size, T(0));
      ops.set_rows(elem, n, rows.data());
      eval_nodes<T, T>(prog, rows.data(), 1, ops.stride(), orow, C);
    }
  }
}

// Nodes of one element summed together in registers before one add to the element's rows.
constexpr int kNodesPerChunk = 8;

// Per-element output (a sum over the nodes of each element): nodes ordered by element and taken
// in chunks of up to kNodesPerChunk of one element; private float64 accumulators per thread, so
// long sums over nodes keep their precision in float32, added up at the end.
template <typename T>
void run_per_elem(const SparsePolynomialArgs& a, const Program<T>& prog, at::Tensor& out,
                  int64_t C) {
  const Operands<T> ops(a, C);
  const int64_t* elem = a.elem->data_ptr<int64_t>();
  const int64_t N = a.num_rows, E = a.num_elems, row_size = a.num_out * C;
  std::vector<int64_t> start(E + 1, 0), order(N);  // nodes sorted by element (counting sort)
  for (int64_t n = 0; n < N; ++n) ++start[elem[n] + 1];
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t n = 0; n < N; ++n) order[next[elem[n]]++] = n;
  std::vector<int64_t> chunk_begin, chunk_end;  // positions in `order`
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = start[e]; i < start[e + 1]; i += kNodesPerChunk) {
      chunk_begin.push_back(i);
      chunk_end.push_back(std::min(i + kNodesPerChunk, start[e + 1]));
    }
  }
  const int64_t num_chunks = static_cast<int64_t>(chunk_begin.size());
  T* out_data = out.data_ptr<T>();
  const int num_threads = threads_for(N, prog, C);
  const int64_t out_size = out.numel();
  std::vector<double> partial(size_t(num_threads) * out_size, 0.0);
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<const T*> rows(size_t(kNodesPerChunk) * ops.stride());
    double* own = partial.data() + size_t(omp_get_thread_num()) * out_size;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < num_chunks; ++i) {
      const int64_t first = chunk_begin[i], count = chunk_end[i] - first;
      for (int64_t k = 0; k < count; ++k) {
        ops.set_rows(elem, order[first + k], rows.data() + k * ops.stride());
      }
      eval_nodes<T, double>(prog, rows.data(), static_cast<int>(count), ops.stride(),
                            own + elem[order[first]] * row_size, C);
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
