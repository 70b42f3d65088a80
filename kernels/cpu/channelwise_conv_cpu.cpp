// CPU work of the fused channelwise conv: OpenMP over target nodes (CSR), vectorised over channels.
// Features are in ir_mul layout (per irrep block: component-major, channel-contiguous). Per edge
// and path the CG terms contracted with the edge attributes form a small dense matrix M[b][a]
// (b: accumulated component, a: gathered one), applied to register blocks of channels by kernels
// specialised for the irrep dimensions 1, 3, 5, 7 (a generic kernel covers the rest).
#include "channelwise_conv_cpu.h"

#include "../common/gemm.h"

#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace cfmtrain::conv {
namespace {

constexpr int64_t kMaxDim = 15;  // irreps up to l = 7
constexpr int64_t kAhead = 2;    // edges ahead whose rows are prefetched

template <typename T>
struct Term {
  int32_t a, j, b;  // gathered component, attribute component, accumulated component
  T c;
};

template <typename T>
struct Path;

// One gathered item: source row, edge weight row and the edge's matrix M for the current path.
template <typename T>
struct Item {
  const T *s, *w, *m;
};

template <typename T>
using GatherFn = void (*)(const Path<T>&, const Item<T>*, T*);
template <typename T>
using EdgeFn = void (*)(const Path<T>&, const T*, const T*, const T*, const T*, T*, T*, T*);

template <typename T>
struct Path {
  int64_t mul, in_off, in_dim, w_off, y_off, y_dim, out_off, out_dim;
  std::vector<Term<T>> terms;
  int64_t h_off;  // offset of the path's H[a][j] block in the edge kernel's per-receiver scratch
  GatherFn<T> gather1, gather2, gather4;  // K = 1, 2, 4 items at once
  // by the outputs asked: attribute (1) | weight (2) | sender features (4); + 8: the weight
  // gradient is added to the row (a later form of a multi-form pass) instead of stored
  EdgeFn<T> edge[16];
};

// ---- SIMD helpers: a block of channels is NV registers of four AVX lanes (GCC vectors) --------

template <typename T>
struct Simd {
  typedef T V __attribute__((vector_size(32)));
};

template <typename V, typename T>
inline V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <typename V, typename T>
inline void store(T* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

template <typename T, typename V>
inline T lane_sum(const V& v) {
  if constexpr (std::is_same_v<T, V>) {
    return v;
  } else {
    T s = 0;
    for (size_t l = 0; l < sizeof(V) / sizeof(T); ++l) s += v[l];
    return s;
  }
}

// Calls body.template operator()<V, NV>(u0) on channels [u0, u0 + NV * lanes(V)): NV registers
// at a time, then one, then single channels (V = T).
template <typename T, int NV, typename Body>
inline void for_channel_blocks(int64_t mul, Body&& body) {
  using V = typename Simd<T>::V;
  constexpr int64_t L = sizeof(V) / sizeof(T);
  int64_t u = 0;
  for (; u + NV * L <= mul; u += NV * L) body.template operator()<V, NV>(u);
  for (; u + L <= mul; u += L) body.template operator()<V, 1>(u);
  for (; u < mul; ++u) body.template operator()<T, 1>(u);
}

// Edge rows are visited in CSR order, scattered in memory: fetch a later edge's rows ahead.
template <typename T>
inline void prefetch_row(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < n * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(c + b);
}

// M[b][a] = sum_j c_{a j b} y_j for one edge.
template <typename T>
inline void edge_matrix(const Path<T>& p, const T* y, T* m) {
  std::fill(m, m + p.in_dim * p.out_dim, T(0));
  for (const auto& t : p.terms) m[t.b * p.in_dim + t.a] += t.c * y[p.y_off + t.j];
}

// ---- kernels for one edge and path; IN/OUT = 0 means "read the dimension at run time" ---------

// out_b += sum_k sum_a M_k[b][a] (src_k,a * w_k) for K (edge, attr, weight) items at once, so
// that each accumulator block is loaded and stored once per K items.
template <typename T, int IN, int OUT, int K>
void gather_path(const Path<T>& p, const Item<T>* items, T* o) {
  const int64_t in = IN ? IN : p.in_dim, out = OUT ? OUT : p.out_dim, mul = p.mul;
  for_channel_blocks<T, 2>(mul, [&]<typename V, int NV>(int64_t u0) {
    constexpr int64_t L = sizeof(V) / sizeof(T);
    V sw[K][IN ? IN : kMaxDim][NV];
    for (int k = 0; k < K; ++k) {
      V wv[NV];
      for (int n = 0; n < NV; ++n) wv[n] = load<V>(items[k].w + p.w_off + u0 + n * L);
      const T* s = items[k].s + p.in_off + u0;
      for (int64_t a = 0; a < in; ++a)
        for (int n = 0; n < NV; ++n) sw[k][a][n] = load<V>(s + a * mul + n * L) * wv[n];
    }
    for (int64_t b = 0; b < out; ++b) {
      T* ob = o + p.out_off + b * mul + u0;
      V acc[NV];
      for (int n = 0; n < NV; ++n) acc[n] = load<V>(ob + n * L);
      for (int k = 0; k < K; ++k)
        for (int64_t a = 0; a < in; ++a) {
          const T c = items[k].m[b * in + a];
          for (int n = 0; n < NV; ++n) acc[n] += c * sw[k][a][n];
        }
      for (int n = 0; n < NV; ++n) store(ob + n * L, acc[n]);
    }
  });
}

// The edge slots through H[a][j] = sum_b c_{a j b} g_b (per receiver): with P_j = sum_a x_a H[a][j],
// gw = sum_j y_j P_j and gy_j = <P_j, w>; the sender's feature gradient (transposed gather) is
// gx_a += w * Q_a with Q_a = sum_j y_j H[a][j], from the same H loads. gw is stored, or with AccW
// added to what an earlier form of the same pass stored.
template <typename T, int IN, int J, bool NeedY, bool NeedW, bool NeedX, bool AccW>
void edge_path(const Path<T>& p, const T* h, const T* xs, const T* y, const T* w, T* gy, T* gw,
               T* gx) {
  using VT = typename Simd<T>::V;
  const int64_t in = IN ? IN : p.in_dim, nj = J ? J : p.y_dim, mul = p.mul;
  const T* x = xs + p.in_off;
  const T* wp = w + p.w_off;
  VT dots[J ? J : kMaxDim] = {};  // vector partial sums of gy_j
  T dots_tail[J ? J : kMaxDim] = {};
  for_channel_blocks<T, 2>(mul, [&]<typename V, int NV>(int64_t u0) {
    constexpr int64_t L = sizeof(V) / sizeof(T);
    constexpr bool NeedP = NeedY || NeedW;
    V xa[IN ? IN : kMaxDim][NV], wv[NV], acc[NV] = {};
    V qa[NeedX ? (IN ? IN : kMaxDim) : 1][NV] = {};
    if constexpr (NeedP)
      for (int64_t a = 0; a < in; ++a)
        for (int n = 0; n < NV; ++n) xa[a][n] = load<V>(x + a * mul + u0 + n * L);
    if constexpr (NeedY || NeedX)
      for (int n = 0; n < NV; ++n) wv[n] = load<V>(wp + u0 + n * L);
    for (int64_t j = 0; j < nj; ++j) {
      V pj[NV] = {};
      const T yj = y[p.y_off + j];
      for (int64_t a = 0; a < in; ++a)
        for (int n = 0; n < NV; ++n) {
          const V hv = load<V>(h + (a * nj + j) * mul + u0 + n * L);
          if constexpr (NeedP) pj[n] += xa[a][n] * hv;
          if constexpr (NeedX) qa[a][n] += yj * hv;
        }
      if constexpr (NeedW)
        for (int n = 0; n < NV; ++n) acc[n] += yj * pj[n];
      if constexpr (NeedY) {
        if constexpr (std::is_same_v<V, T>) {
          dots_tail[j] += pj[0] * wv[0];
        } else {
          for (int n = 0; n < NV; ++n) dots[j] += pj[n] * wv[n];
        }
      }
    }
    if constexpr (NeedW)
      for (int n = 0; n < NV; ++n) {
        T* dst = gw + p.w_off + u0 + n * L;
        if constexpr (AccW) {
          store(dst, load<V>(dst) + acc[n]);
        } else {
          store(dst, acc[n]);
        }
      }
    if constexpr (NeedX)
      for (int64_t a = 0; a < in; ++a)
        for (int n = 0; n < NV; ++n) {
          T* dst = gx + p.in_off + a * mul + u0 + n * L;
          store(dst, load<V>(dst) + wv[n] * qa[a][n]);
        }
  });
  if constexpr (NeedY)
    for (int64_t j = 0; j < nj; ++j) gy[p.y_off + j] += lane_sum<T>(dots[j]) + dots_tail[j];
}

// H[a][j] = sum_b c_{a j b} g_b for every path, once per receiver.
template <typename T>
void receiver_h(const std::vector<Path<T>>& paths, const T* g, T* h) {
  for (const auto& p : paths) {
    T* hp = h + p.h_off;
    std::fill(hp, hp + p.in_dim * p.y_dim * p.mul, T(0));
    for (const auto& t : p.terms) {
      T* dst = hp + (t.a * p.y_dim + t.j) * p.mul;
      const T* src = g + p.out_off + t.b * p.mul;
#pragma omp simd
      for (int64_t u = 0; u < p.mul; ++u) dst[u] += t.c * src[u];
    }
  }
}

// Picks the kernel specialised for (in, out) in {1, 3, 5, 7}^2, else the generic one.
template <typename T, template <int, int> class Kernel>
auto select_kernel(int64_t in, int64_t out) {
  auto with_in = [&]<int I>() {
    switch (out) {
      case 1: return Kernel<I, 1>::fn;
      case 3: return Kernel<I, 3>::fn;
      case 5: return Kernel<I, 5>::fn;
      case 7: return Kernel<I, 7>::fn;
      default: return Kernel<0, 0>::fn;
    }
  };
  switch (in) {
    case 1: return with_in.template operator()<1>();
    case 3: return with_in.template operator()<3>();
    case 5: return with_in.template operator()<5>();
    case 7: return with_in.template operator()<7>();
    default: return Kernel<0, 0>::fn;
  }
}

template <typename T, int Items>
struct GatherK {
  template <int I, int O>
  struct K {
    static constexpr GatherFn<T> fn = &gather_path<T, I, O, Items>;
  };
};

template <typename T, bool Y, bool W, bool X, bool A = false>
struct EdgeK {
  template <int I, int O>
  struct K {
    static constexpr EdgeFn<T> fn = &edge_path<T, I, O, Y, W, X, A>;
  };
};

template <typename T>
std::vector<Path<T>> load_paths(const Descriptor& desc, bool transpose) {
  auto P = desc.paths.accessor<int64_t, 2>();
  auto Tm = desc.terms.accessor<int64_t, 2>();
  auto C = desc.coeffs.accessor<double, 1>();
  std::vector<Path<T>> paths;
  int64_t h_size = 0;
  for (int64_t p = 0; p < P.size(0); ++p) {
    const int64_t x_off = P[p][1], x_dim = P[p][2], o_off = P[p][6], o_dim = P[p][7];
    TORCH_CHECK(x_dim <= kMaxDim && o_dim <= kMaxDim, "channelwise_conv: irrep dimension above ",
                kMaxDim, " in path ", p);
    TORCH_CHECK(P[p][4] <= kMaxDim, "channelwise_conv: attribute irrep dimension above ", kMaxDim,
                " in path ", p);
    Path<T> path{P[p][0], transpose ? o_off : x_off, transpose ? o_dim : x_dim, P[p][5], P[p][3],
                 P[p][4], transpose ? x_off : o_off, transpose ? x_dim : o_dim};
    for (int64_t t = P[p][8]; t < P[p][9]; ++t) {
      const auto i = static_cast<int32_t>(Tm[t][0]), j = static_cast<int32_t>(Tm[t][1]);
      const auto k = static_cast<int32_t>(Tm[t][2]);
      path.terms.push_back({transpose ? k : i, j, transpose ? i : k, static_cast<T>(C[t])});
    }
    path.h_off = h_size;
    h_size += path.in_dim * path.y_dim * path.mul;
    const int64_t in = path.in_dim, out = path.out_dim;
    path.gather1 = select_kernel<T, GatherK<T, 1>::template K>(in, out);
    path.gather2 = select_kernel<T, GatherK<T, 2>::template K>(in, out);
    path.gather4 = select_kernel<T, GatherK<T, 4>::template K>(in, out);
    const int64_t y = path.y_dim;
    std::fill(std::begin(path.edge), std::end(path.edge), nullptr);
    path.edge[1] = select_kernel<T, EdgeK<T, true, false, false>::template K>(in, y);
    path.edge[2] = select_kernel<T, EdgeK<T, false, true, false>::template K>(in, y);
    path.edge[3] = select_kernel<T, EdgeK<T, true, true, false>::template K>(in, y);
    path.edge[4] = select_kernel<T, EdgeK<T, false, false, true>::template K>(in, y);
    path.edge[5] = select_kernel<T, EdgeK<T, true, false, true>::template K>(in, y);
    path.edge[6] = select_kernel<T, EdgeK<T, false, true, true>::template K>(in, y);
    path.edge[7] = select_kernel<T, EdgeK<T, true, true, true>::template K>(in, y);
    path.edge[8 + 2] = select_kernel<T, EdgeK<T, false, true, false, true>::template K>(in, y);
    path.edge[8 + 3] = select_kernel<T, EdgeK<T, true, true, false, true>::template K>(in, y);
    path.edge[8 + 6] = select_kernel<T, EdgeK<T, false, true, true, true>::template K>(in, y);
    path.edge[8 + 7] = select_kernel<T, EdgeK<T, true, true, true, true>::template K>(in, y);
    paths.push_back(std::move(path));
  }
  return paths;
}

// Threads only pay off above some work; small calls (gradcheck, tiny graphs) run serially.
template <typename T>
bool worth_threads(const std::vector<Path<T>>& paths, int64_t n_edges) {
  int64_t per_edge = 0;
  for (const auto& p : paths) per_edge += (p.in_dim + 1) * p.out_dim * p.mul;
  return at::get_num_threads() > 1 && n_edges * per_edge > (int64_t{1} << 16);
}

// Consecutive targets grouped into chunks [bounds[i], bounds[i + 1]) of at least `min_edges`
// edges (or to the end): factored weights are formed per chunk by one matmul.
inline std::vector<int64_t> chunk_bounds(const int64_t* row, int64_t n_target, int64_t min_edges) {
  std::vector<int64_t> bounds{0};
  for (int64_t t = 1; t <= n_target; ++t)
    if (t == n_target || row[t] - row[bounds.back()] >= min_edges) bounds.push_back(t);
  if (n_target == 0) bounds.push_back(0);
  return bounds;
}

constexpr int64_t kChunkEdges = 64;

// The weight rows of one chunk's edges (CSR positions q0..q1): pointers into the stored tensor,
// or, for factored weights, into the formed rows when given, else rows of a per-thread tile =
// H[edges] @ basis.
template <typename T>
struct WeightRows {
  const Weights& src;
  at::Tensor h_tile, w_tile;  // factored only (w_tile: without formed rows)

  WeightRows(const Weights& weights, int64_t capacity) : src(weights) {
    if (src.factored()) {
      h_tile = at::empty({capacity, src.weight.size(1)}, src.weight.options());
      if (!src.rows.defined())
        w_tile = at::empty({capacity, src.basis.size(1)}, src.weight.options());
    }
  }
  // Makes the chunk's weight rows readable when `form` (forms them, unless given formed), and
  // gathers its hidden rows into h_tile when `need_h` or to form them.
  void load(const int64_t* prm, int64_t q0, int64_t q1, bool form, bool need_h) {
    if (!src.factored()) return;
    form = form && !src.rows.defined();
    if (!form && !need_h) return;
    const int64_t k = src.weight.size(1), n = q1 - q0;
    const T* h = src.weight.data_ptr<T>();
    T* ht = h_tile.data_ptr<T>();
    for (int64_t q = q0; q < q1; ++q) std::memcpy(ht + (q - q0) * k, h + prm[q] * k, k * sizeof(T));
    if (form && n > 0) {
      at::Tensor w = w_tile.narrow(0, 0, n);
      gemm::mm_into(w, h_tile.narrow(0, 0, n), src.basis, false);
    }
  }
  // Row of the edge at CSR position q (edge id e) of the chunk starting at q0.
  const T* row(int64_t q, int64_t q0, int64_t e) const {
    if (!src.factored()) return src.weight.data_ptr<T>() + e * src.weight.size(1);
    if (src.rows.defined()) return src.rows.data_ptr<T>() + q * src.rows.size(1);
    return w_tile.data_ptr<T>() + (q - q0) * w_tile.size(1);
  }
};

// The most edges in one chunk (rows of a tile).
inline int64_t tile_capacity(const std::vector<int64_t>& bounds, const int64_t* row) {
  int64_t cap = 1;
  for (size_t i = 0; i + 1 < bounds.size(); ++i)
    cap = std::max(cap, row[bounds[i + 1]] - row[bounds[i]]);
  return cap;
}

// Accumulates (source row, attribute row, weight row) items into one output row, applying them
// four (or two, one) at a time so that each accumulator block is loaded and stored once per group.
template <typename T>
struct ItemSink {
  const std::vector<Path<T>>& paths;
  T* mats;  // 4 kMaxDim x kMaxDim scratch matrices
  T* o = nullptr;
  struct Src {
    const T *s, *y, *w;
  } group[4];
  int k = 0;

  void start(T* row, int64_t n) {
    o = row;
    std::fill(o, o + n, T(0));
  }
  void add(const T* s, const T* y, const T* w) {
    group[k++] = {s, y, w};
    if (k == 4) flush(4), k = 0;
  }
  void finish() {
    if (k >= 2) flush(2), k -= 2, group[0] = group[2];
    if (k == 1) flush(1);
    k = 0;
  }
  void flush(int count) {
    for (const auto& p : paths) {
      Item<T> items[4];
      for (int i = 0; i < count; ++i) {
        T* m = mats + i * kMaxDim * kMaxDim;
        edge_matrix(p, group[i].y, m);
        items[i] = {group[i].s, group[i].w, m};
      }
      (count == 4 ? p.gather4 : count == 2 ? p.gather2 : p.gather1)(p, items, o);
    }
  }
};

template <typename T>
void gather_kernel(const at::Tensor& src, const at::Tensor& attr, const Weights& weights,
                   const at::Tensor& source_index, const at::Tensor& rowptr,
                   const at::Tensor& perm, const std::vector<Path<T>>& paths, at::Tensor& out) {
  const T* s_ptr = src.data_ptr<T>();
  const T* y_ptr = attr.data_ptr<T>();
  const int64_t* idx = source_index.data_ptr<int64_t>();
  const int64_t* row = rowptr.data_ptr<int64_t>();
  const int64_t* prm = perm.data_ptr<int64_t>();
  T* o_ptr = out.data_ptr<T>();
  const int64_t s_stride = src.size(1), y_stride = attr.size(1);
  const int64_t o_stride = out.size(1), n_target = out.size(0);
  const bool factored = weights.factored();
  const int64_t n_edges = perm.size(0);
  const auto bounds = chunk_bounds(row, n_target, factored ? kChunkEdges : 1);
  const int64_t n_chunks = static_cast<int64_t>(bounds.size()) - 1;
  const int64_t capacity = tile_capacity(bounds, row);
  const int64_t step = factored ? 1 : 4;

#pragma omp parallel num_threads(at::get_num_threads()) if (worth_threads(paths, perm.size(0)))
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;  // the tiles' matmuls, per thread
    std::vector<T> mats(4 * kMaxDim * kMaxDim);
    WeightRows<T> rows(weights, capacity);
    ItemSink<T> sink{paths, mats.data()};
#pragma omp for schedule(dynamic, step)
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int64_t q0 = row[bounds[c]];
      rows.load(prm, q0, row[bounds[c + 1]], true, false);
      for (int64_t a = bounds[c]; a < bounds[c + 1]; ++a) {
        sink.start(o_ptr + a * o_stride, o_stride);
        for (int64_t q = row[a]; q < row[a + 1]; ++q) {
          const int64_t e = prm[q];
          if (q + kAhead < n_edges && !factored)
            prefetch_row(rows.row(q + kAhead, q0, prm[q + kAhead]), weights.weight.size(1));
          sink.add(s_ptr + idx[e] * s_stride, y_ptr + e * y_stride, rows.row(q, q0, e));
        }
        sink.finish();
      }
    }
  }
}

// A form's pointers in the edge kernel; h: its per-receiver H scratch (-1: none needed), shared
// by forms with the same cotangent.
template <typename T>
struct FormRows {
  const T *x, *y, *g;
  bool attr, x_grad, out;
  int h;
};

template <typename T>
void edge_kernel(const std::vector<EdgeForm>& forms, const Weights& weights, const Graph& g,
                 const std::vector<Path<T>>& paths, T* gy_ptr, at::Tensor* g_weight,
                 at::Tensor* g_basis, at::Tensor* g_x, at::Tensor* out, const T* gw_in,
                 T* gw_emit) {
  const int64_t* snd = g.sender.data_ptr<int64_t>();
  const int64_t* row = g.recv_rowptr.data_ptr<int64_t>();
  const int64_t* prm = g.recv_perm.data_ptr<int64_t>();
  const int64_t x_stride = forms[0].x.size(1), y_stride = forms[0].edge_attr.size(1);
  const int64_t g_stride = forms[0].grad.size(1), n_recv = g.recv_rowptr.size(0) - 1;
  const bool factored = weights.factored();
  const int64_t n_edges = forms[0].edge_attr.size(0);
  const int64_t w_dim = (factored ? weights.basis : weights.weight).size(1);
  const bool need_gw = g_weight != nullptr || g_basis != nullptr || gw_emit != nullptr;
  std::vector<FormRows<T>> fr;
  std::vector<const T*> h_grads;  // the cotangent of each H scratch
  bool rows_needed = false;  // weight rows are read (attribute, x or message slots)
  for (const auto& f : forms) {
    FormRows<T> r{f.x.data_ptr<T>(), f.edge_attr.data_ptr<T>(), f.grad.data_ptr<T>(),
                  f.need_attr, f.need_x, f.need_out, -1};
    if (r.attr || need_gw || r.x_grad) {  // (not for the message alone)
      auto same = std::find(h_grads.begin(), h_grads.end(), r.g);
      r.h = static_cast<int>(same - h_grads.begin());
      if (same == h_grads.end()) h_grads.push_back(r.g);
    }
    rows_needed = rows_needed || r.attr || r.x_grad || r.out;
    fr.push_back(r);
  }
  const int64_t n_h = static_cast<int64_t>(h_grads.size());
  T* gw_ptr = g_weight && !factored ? g_weight->data_ptr<T>() : nullptr;
  int64_t h_size = 1;
  for (const auto& p : paths) h_size = std::max(h_size, p.h_off + p.in_dim * p.y_dim * p.mul);
  const auto bounds = chunk_bounds(row, n_recv, factored ? kChunkEdges : 1);
  const int64_t n_chunks = static_cast<int64_t>(bounds.size()) - 1;
  const int64_t capacity = tile_capacity(bounds, row);
  const int64_t step = factored ? 1 : 4;
  const bool threads = worth_threads(paths, n_edges * static_cast<int64_t>(forms.size()));
  const int64_t n_threads = threads ? at::get_num_threads() : 1;
  std::vector<at::Tensor> basis_sums(n_threads);  // per thread: sum over its edges of H^T gW
  std::vector<at::Tensor> x_sums(n_threads);      // per thread: its edges' sender gradients
  const at::TensorOptions options = forms[0].x.options();
  // B^T for the chunks' dH = gW @ B^T, transposed once so that its rows are contiguous
  const at::Tensor basis_t =
      factored && g_weight ? weights.basis.t().contiguous() : at::Tensor();

  // Receiver order: H is built once per receiver (and cotangent) and reused by its edges.
#pragma omp parallel num_threads(n_threads) if (threads)
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;  // the tiles' matmuls, per thread
    std::vector<T> h(std::max<int64_t>(n_h, 1) * h_size), mats(4 * kMaxDim * kMaxDim);
    ItemSink<T> sink{paths, mats.data()};
    WeightRows<T> rows(weights, capacity);
    at::Tensor gw_tile, gh_tile, basis_sum;
    if (factored && need_gw && !gw_emit) gw_tile = at::empty({capacity, w_dim}, options);
    if (factored && g_weight) gh_tile = at::empty({capacity, weights.weight.size(1)}, options);
    if (factored && g_basis) basis_sum = at::zeros_like(weights.basis, options);
    at::Tensor x_sum = g_x ? at::zeros_like(forms[0].x) : at::Tensor();
    T* gx_base = g_x ? x_sum.data_ptr<T>() : nullptr;
#pragma omp for schedule(dynamic, step)
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int64_t q0 = row[bounds[c]], q1 = row[bounds[c + 1]];
      if (q0 == q1) {  // receivers without edges: a zero message
        if (out)
          std::fill_n(out->data_ptr<T>() + bounds[c] * g_stride,
                      (bounds[c + 1] - bounds[c]) * g_stride, T(0));
        continue;
      }
      rows.load(prm, q0, q1, rows_needed, g_basis != nullptr);
      for (int64_t r = bounds[c]; r < bounds[c + 1]; ++r) {
        if (row[r] == row[r + 1]) {
          if (out) std::fill_n(out->data_ptr<T>() + r * g_stride, g_stride, T(0));
          continue;
        }
        for (int64_t i = 0; i < n_h; ++i) receiver_h(paths, h_grads[i] + r * g_stride, &h[i * h_size]);
        if (out) sink.start(out->data_ptr<T>() + r * g_stride, g_stride);
        for (int64_t q = row[r]; q < row[r + 1]; ++q) {
          const int64_t e = prm[q];
          if (q + kAhead < n_edges) {
            if (!factored) prefetch_row(rows.row(q + kAhead, q0, prm[q + kAhead]), w_dim);
            for (const auto& f : fr)
              if (f.h >= 0 || f.out) prefetch_row(f.x + snd[prm[q + kAhead]] * x_stride, x_stride);
          }
          T* gy = gy_ptr ? gy_ptr + e * y_stride : nullptr;
          T* gw = !need_gw   ? nullptr
                  : gw_emit  ? gw_emit + q * w_dim
                  : factored ? gw_tile.data_ptr<T>() + (q - q0) * w_dim
                             : gw_ptr + e * w_dim;
          if (gy) std::fill(gy, gy + y_stride, T(0));
          T* gx = gx_base ? gx_base + snd[e] * x_stride : nullptr;
          const T* w = rows.row(q, q0, e);  // read for gy, gx, out only (a tile row is formed then)
          bool gw_stored = false;  // the first form stores its weight gradient, later ones add
          for (const auto& f : fr) {
            const int kind = (f.attr ? 1 : 0) | (gw ? 2 : 0) | (f.x_grad ? 4 : 0);
            if (!kind) continue;
            const int fn = kind | (gw && gw_stored ? 8 : 0);
            const T* hf = &h[f.h * h_size];
            for (const auto& p : paths)
              p.edge[fn](p, hf + p.h_off, f.x + snd[e] * x_stride, f.y + e * y_stride, w,
                         f.attr ? gy : nullptr, gw, f.x_grad ? gx : nullptr);
            gw_stored = gw_stored || gw != nullptr;
          }
          for (const auto& f : fr)
            if (f.out) sink.add(f.x + snd[e] * x_stride, f.y + e * y_stride, w);
        }
        if (out) sink.finish();
      }
      if (factored && need_gw && !gw_emit) {  // the chunk's per-edge weight gradients, contracted
        const int64_t n = q1 - q0;
        const at::Tensor gw = gw_tile.narrow(0, 0, n);
        if (gw_in) {  // with those another pass left uncontracted
          T* dst = gw_tile.data_ptr<T>();
          const T* add = gw_in + q0 * w_dim;
#pragma omp simd
          for (int64_t i = 0; i < n * w_dim; ++i) dst[i] += add[i];
        }
        if (g_weight) {
          at::Tensor gh = gh_tile.narrow(0, 0, n);
          gemm::mm_into(gh, gw, basis_t, false);
          const int64_t k = gh_tile.size(1);
          T* dst = g_weight->data_ptr<T>();
          const T* src = gh_tile.data_ptr<T>();
          for (int64_t q = q0; q < q1; ++q)
            std::memcpy(dst + prm[q] * k, src + (q - q0) * k, k * sizeof(T));
        }
        if (g_basis) gemm::mm_into(basis_sum, rows.h_tile.narrow(0, 0, n).t(), gw, true);
      }
    }
    if (basis_sum.defined()) basis_sums[omp_get_thread_num()] = basis_sum;
    if (x_sum.defined()) x_sums[omp_get_thread_num()] = x_sum;
  }
  for (auto [out, sums] : {std::pair{g_basis, &basis_sums}, std::pair{g_x, &x_sums}}) {
    if (!out) continue;
    out->zero_();
    for (const auto& s : *sums)
      if (s.defined()) out->add_(s);
  }
}

}  // namespace

at::Tensor gather_cpu(const at::Tensor& src, const at::Tensor& edge_attr, const Weights& weights,
                      const Graph& graph, const Descriptor& desc, bool transpose) {
  const at::Tensor& rowptr = transpose ? graph.send_rowptr : graph.recv_rowptr;
  const at::Tensor& perm = transpose ? graph.send_perm : graph.recv_perm;
  const at::Tensor& source_index = transpose ? graph.receiver : graph.sender;
  const int64_t out_dim = transpose ? desc.dims[0] : desc.dims[3];
  at::Tensor out = at::empty({rowptr.size(0) - 1, out_dim}, src.options());
  AT_DISPATCH_FLOATING_TYPES(src.scalar_type(), "channelwise_conv_gather", [&] {
    const auto paths = load_paths<scalar_t>(desc, transpose);
    gather_kernel<scalar_t>(src, edge_attr, weights, source_index, rowptr, perm, paths, out);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> edge_forms_cpu(
    const std::vector<EdgeForm>& forms, const Weights& weights, const Graph& graph,
    const Descriptor& desc, bool need_weight, bool need_basis, const at::Tensor& weight_grad_in,
    bool emit_weight_grad) {
  TORCH_CHECK(!forms.empty(), "channelwise_conv: an edge pass needs at least one form");
  const bool factored = weights.factored();
  need_basis = need_basis && factored;
  TORCH_CHECK(!emit_weight_grad || (factored && !need_weight && !need_basis),
              "channelwise_conv: emit_weight_grad needs factored weights and neither the weight "
              "nor the basis slot");
  TORCH_CHECK(!weight_grad_in.defined() || (factored && (need_weight || need_basis)),
              "channelwise_conv: weight_grad_in needs factored weights and the weight or basis "
              "slot");
  bool need_attr = false, need_x = false, need_out = false;
  for (const auto& f : forms) {
    need_attr = need_attr || f.need_attr;
    need_x = need_x || f.need_x;
    need_out = need_out || f.need_out;
  }
  const EdgeForm& first = forms[0];
  const auto none = [&] { return at::empty({0}, first.x.options()); };
  at::Tensor out = need_out ? at::empty_like(first.grad) : none();  // every row written
  at::Tensor gy = need_attr ? at::empty_like(first.edge_attr) : none();
  // The paths' weight segments tile each row (checked by the caller): no zero fill needed.
  at::Tensor gw = emit_weight_grad ? at::empty({first.edge_attr.size(0), weights.basis.size(1)},
                                               first.x.options())
                  : need_weight    ? at::empty_like(weights.weight)
                                   : none();
  at::Tensor gb = need_basis ? at::empty_like(weights.basis) : none();
  at::Tensor gx = need_x ? at::empty_like(first.x) : none();
  if (!need_attr && !need_weight && !need_basis && !need_x && !need_out && !emit_weight_grad)
    return {gy, gw, gb, gx, out};
  AT_DISPATCH_FLOATING_TYPES(first.x.scalar_type(), "channelwise_conv_edge", [&] {
    const auto paths = load_paths<scalar_t>(desc, false);
    edge_kernel<scalar_t>(forms, weights, graph, paths,
                          need_attr ? gy.data_ptr<scalar_t>() : nullptr,
                          need_weight ? &gw : nullptr, need_basis ? &gb : nullptr,
                          need_x ? &gx : nullptr, need_out ? &out : nullptr,
                          weight_grad_in.defined() ? weight_grad_in.data_ptr<scalar_t>() : nullptr,
                          emit_weight_grad ? gw.data_ptr<scalar_t>() : nullptr);
  });
  return {gy, gw, gb, gx, out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> edge_cpu(
    const at::Tensor& x, const at::Tensor& edge_attr, const Weights& weights,
    const at::Tensor& grad, const Graph& graph, const Descriptor& desc, bool need_attr,
    bool need_weight, bool need_basis, bool need_x, bool need_out) {
  return edge_forms_cpu({{x, edge_attr, grad, need_attr, need_x, need_out}}, weights, graph,
                        desc, need_weight, need_basis, at::Tensor(), false);
}

}  // namespace cfmtrain::conv
