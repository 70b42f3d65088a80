// cfmtrain._balance: bindings of Algorithm 1 (algorithm1.h), our refinement of its leftovers
// (refine.h), the step formation and the descending order; the peers are in peers.cpp.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "algorithm1.h"
#include "common.h"
#include "oversize.h"
#include "rebalance.h"
#include "refine.h"

namespace cfm_balance {
namespace {

// Bins in CSR form with the load of each bin.
template <typename T>
struct LoadedBins {
  std::vector<i64> flat, offsets{0};
  std::vector<T> load;
};

// Graphs scattered into the bins in `bin_order` (each bin's graphs in visiting order).
template <typename T>
void scatter(const Assignment<T>& as, const i64* ord, const std::vector<i64>& bin_order,
             i64* flat, i64* offsets) {
  std::vector<i64> start(as.count.size());
  offsets[0] = 0;
  for (size_t k = 0; k < bin_order.size(); ++k) {
    start[bin_order[k]] = offsets[k];
    offsets[k + 1] = offsets[k] + as.count[bin_order[k]];
  }
  for (size_t q = 0; q < as.bin_of.size(); ++q) flat[start[as.bin_of[q]]++] = ord[q];
}

template <typename T>
LoadedBins<T> to_loaded_bins(Assignment<T>&& as, const i64* ord) {
  std::vector<i64> identity(as.count.size());
  std::iota(identity.begin(), identity.end(), 0);
  LoadedBins<T> out;
  out.flat.resize(as.bin_of.size());
  out.offsets.resize(as.count.size() + 1);
  scatter(as, ord, identity, out.flat.data(), out.offsets.data());
  out.load = std::move(as.load);
  return out;
}

// Bins made a multiple of num_ranks, then ordered by load, heaviest first (stable), empty bins
// last. Missing bins are filled by moving the last (smallest) graph of the heaviest bins that hold
// two or more graphs; they stay empty only when every bin holds a single graph.
template <typename T>
py::tuple finalize_bins(LoadedBins<T>&& in, const T* size, i64 num_ranks) {
  const i64 bins = static_cast<i64>(in.load.size());
  std::vector<i64> start(in.offsets.begin(), in.offsets.end() - 1), count(bins);
  for (i64 b = 0; b < bins; ++b) count[b] = in.offsets[b + 1] - in.offsets[b];
  std::vector<T>& load = in.load;
  i64 need = (num_ranks - bins % num_ranks) % num_ranks;
  std::vector<i64> donors;
  while (need > 0) {
    donors.clear();
    for (i64 b = 0; b < static_cast<i64>(count.size()); ++b)
      if (count[b] > 1) donors.push_back(b);
    if (donors.empty()) break;
    std::stable_sort(donors.begin(), donors.end(),
                     [&load](i64 x, i64 y) { return load[x] > load[y]; });
    const i64 take = std::min<i64>(need, static_cast<i64>(donors.size()));
    for (i64 k = 0; k < take; ++k) {
      const i64 b = donors[k];
      const i64 moved = start[b] + --count[b];
      load[b] -= size[in.flat[moved]];
      start.push_back(moved);
      count.push_back(1);
      load.push_back(size[in.flat[moved]]);
    }
    need -= take;
  }
  start.resize(start.size() + need, 0);
  count.resize(count.size() + need, 0);
  load.resize(load.size() + need, 0);
  std::vector<i64> order(count.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](i64 x, i64 y) {
    if ((count[x] == 0) != (count[y] == 0)) return count[y] == 0;
    return load[x] > load[y];
  });
  auto flat = py::array_t<i64>(static_cast<py::ssize_t>(in.flat.size()));
  auto offsets = py::array_t<i64>(static_cast<py::ssize_t>(order.size() + 1));
  i64* f = flat.mutable_data();
  i64* o = offsets.mutable_data();
  o[0] = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const i64 b = order[k];
    std::copy(in.flat.begin() + start[b], in.flat.begin() + start[b] + count[b], f + o[k]);
    o[k + 1] = o[k] + count[b];
  }
  return py::make_tuple(flat, offsets);
}

// Algorithm 1 over sizes[order] (non-increasing), with our refinement of the leftovers if asked.
template <typename T>
Assignment<T> run_checked(const Arr<T>& sizes, const Arr<i64>& order, T capacity, i64 num_ranks,
                          bool refine) {
  const T* size = data_1d(sizes, "sizes");
  const i64* ord = data_1d(order, "order");
  if (!(capacity > 0)) throw std::invalid_argument("capacity must be positive");
  if (num_ranks < 1) throw std::invalid_argument("num_ranks must be at least 1");
  const i64 n = order.shape(0);
  py::gil_scoped_release nogil;
  const std::vector<T> ss = visiting_sizes(size, sizes.shape(0), ord, n, capacity);
  Assignment<T> as = algorithm1_rounds(ss.data(), n, capacity, num_ranks);
  if (!refine) return as;
  return refine_leftovers(ss.data(), n, capacity, num_ranks, std::move(as));
}

// Algorithm 1 as the pseudocode emits it: (flat, offsets) of the non-empty bins (refined: ours).
template <typename T>
py::tuple algorithm1(const Arr<T>& sizes, const Arr<i64>& order, T capacity, i64 num_ranks,
                     bool refine) {
  LoadedBins<T> bins = to_loaded_bins(run_checked(sizes, order, capacity, num_ranks, refine),
                                      order.data());
  Csr out;
  out.flat = std::move(bins.flat);
  out.offsets = std::move(bins.offsets);
  return to_numpy(std::move(out));
}

// Our step rebalancing (rebalance.h) of a plan (flat, offsets), in place.
template <typename T>
py::tuple rebalanced(py::tuple plan, const T* size, i64 num_ranks, T capacity) {
  auto flat = plan[0].cast<py::array_t<i64>>();
  auto offsets = plan[1].cast<py::array_t<i64>>();
  i64* f = flat.mutable_data();
  i64* o = offsets.mutable_data();
  const i64 bins = offsets.shape(0) - 1;
  py::gil_scoped_release nogil;
  rebalance_steps(size, f, o, bins, num_ranks, capacity);
  return plan;
}

// Algorithm 1 made into steps, as finalize_bins does; when the bins are already a multiple of
// num_ranks (the usual case) the graphs go straight to their place in the heaviest-first order.
// refine: our two refinements, of the leftovers (refine.h) and of uneven steps (rebalance.h).
template <typename T>
py::tuple pack(const Arr<T>& sizes, const Arr<i64>& order, T capacity, i64 num_ranks,
               bool refine) {
  Assignment<T> as = run_checked(sizes, order, capacity, num_ranks, refine);
  if (as.count.size() % num_ranks != 0) {
    py::tuple out = finalize_bins(to_loaded_bins(std::move(as), order.data()), sizes.data(),
                                  num_ranks);
    return refine ? rebalanced(out, sizes.data(), num_ranks, capacity) : out;
  }
  std::vector<i64> bin_order(as.count.size());
  std::iota(bin_order.begin(), bin_order.end(), 0);
  std::stable_sort(bin_order.begin(), bin_order.end(),
                   [&as](i64 x, i64 y) { return as.load[x] > as.load[y]; });
  auto flat = py::array_t<i64>(static_cast<py::ssize_t>(as.bin_of.size()));
  auto offsets = py::array_t<i64>(static_cast<py::ssize_t>(bin_order.size() + 1));
  i64* f = flat.mutable_data();
  i64* o = offsets.mutable_data();
  {
    py::gil_scoped_release nogil;
    scatter(as, order.data(), bin_order, f, o);
    if (refine) {
      std::vector<T> load(bin_order.size());
      for (size_t k = 0; k < bin_order.size(); ++k) load[k] = as.load[bin_order[k]];
      rebalance_steps(sizes.data(), f, o, static_cast<i64>(bin_order.size()), num_ranks,
                      capacity, load.data());
    }
  }
  return py::make_tuple(flat, offsets);
}

// Our step rebalancing of any plan (flat, offsets): a new (flat, offsets).
template <typename T>
py::tuple rebalance(const Arr<T>& sizes, const Arr<i64>& flat, const Arr<i64>& offsets,
                    T capacity, i64 num_ranks) {
  const T* size = data_1d(sizes, "sizes");
  const i64 bins = offsets.shape(0) - 1;
  if (num_ranks < 1 || bins < 0 || bins % num_ranks != 0)
    throw std::invalid_argument("offsets must hold a multiple of num_ranks bins");
  check_indices(data_1d(flat, "flat"), flat.shape(0), sizes.shape(0), "flat");
  const i64* off = data_1d(offsets, "offsets");
  for (i64 b = 0; b < bins; ++b)
    if (off[b + 1] < off[b]) throw std::invalid_argument("offsets must not decrease");
  if (off[0] != 0 || off[bins] != flat.shape(0))
    throw std::invalid_argument("offsets must run from 0 to len(flat)");
  py::array_t<i64> f(flat.shape(0)), o(offsets.shape(0));
  std::copy(flat.data(), flat.data() + flat.shape(0), f.mutable_data());
  std::copy(off, off + bins + 1, o.mutable_data());
  return rebalanced(py::make_tuple(f, o), size, num_ranks, capacity);
}

// finalize_bins of any bins given as (flat, offsets).
template <typename T>
py::tuple finalize(const Arr<T>& sizes, const Arr<i64>& flat, const Arr<i64>& offsets,
                   i64 num_ranks) {
  const T* size = data_1d(sizes, "sizes");
  const i64* idx = data_1d(flat, "flat");
  const i64* off = data_1d(offsets, "offsets");
  if (num_ranks < 1) throw std::invalid_argument("num_ranks must be at least 1");
  const i64 bins = offsets.shape(0) - 1;
  if (bins < 0 || off[0] != 0 || off[bins] != flat.shape(0))
    throw std::invalid_argument("offsets must run from 0 to len(flat)");
  LoadedBins<T> in;
  in.flat.assign(idx, idx + flat.shape(0));
  in.offsets.assign(off, off + bins + 1);
  in.load.assign(bins, 0);
  for (i64 b = 0; b < bins; ++b) {
    if (off[b + 1] < off[b]) throw std::invalid_argument("offsets must not decrease");
    for (i64 q = off[b]; q < off[b + 1]; ++q) {
      if (idx[q] < 0 || idx[q] >= sizes.shape(0))
        throw std::invalid_argument("flat holds an index outside sizes");
      in.load[b] += size[idx[q]];
    }
  }
  return finalize_bins(std::move(in), size, num_ranks);
}

// Order of `candidates` by size, descending: stable (counting sort for small integer ranges,
// else a stable merge sort); with seed >= 0 each run of equal sizes is then shuffled
// (Fisher-Yates), which breaks ties at random while keeping the sizes non-increasing.
template <typename T>
py::array_t<i64> order_descending(const Arr<T>& sizes, const Arr<i64>& candidates, i64 seed) {
  const T* size = data_1d(sizes, "sizes");
  const i64* cand = data_1d(candidates, "candidates");
  const i64 n = candidates.shape(0);
  check_indices(cand, n, sizes.shape(0), "candidates");
  auto result = py::array_t<i64>(n);
  i64* out = result.mutable_data();
  py::gil_scoped_release nogil;
  bool counting = std::is_integral<T>::value && n > 0;
  i64 lo = 0, hi = 0;
  if (counting) {
    lo = hi = static_cast<i64>(size[cand[0]]);
    for (i64 q = 1; q < n; ++q) {
      lo = std::min(lo, static_cast<i64>(size[cand[q]]));
      hi = std::max(hi, static_cast<i64>(size[cand[q]]));
    }
    counting = hi - lo <= std::max<i64>(4 * n, 1 << 16);
  }
  if (counting) {
    std::vector<i64> pos(hi - lo + 2, 0);
    for (i64 q = 0; q < n; ++q) ++pos[hi - static_cast<i64>(size[cand[q]]) + 1];
    for (size_t k = 1; k < pos.size(); ++k) pos[k] += pos[k - 1];
    for (i64 q = 0; q < n; ++q) out[pos[hi - static_cast<i64>(size[cand[q]])]++] = cand[q];
  } else {
    std::copy(cand, cand + n, out);
    std::stable_sort(out, out + n, [size](i64 x, i64 y) { return size[x] > size[y]; });
  }
  if (seed >= 0) {
    SplitMix64 rng{static_cast<uint64_t>(seed)};
    for (i64 a = 0, b; a < n; a = b) {
      const T s = size[out[a]];
      for (b = a + 1; b < n && size[out[b]] == s; ++b) {
      }
      for (i64 k = b - a - 1; k > 0; --k) std::swap(out[a + k], out[a + rng.below(k + 1)]);
    }
  }
  return result;
}

template <typename T>
void define_all(py::module_& m, const std::string& suffix) {
  m.def(("algorithm1" + suffix).c_str(), &algorithm1<T>, py::arg("sizes"), py::arg("order"),
        py::arg("capacity"), py::arg("num_ranks"), py::arg("refine") = false,
        "Algorithm 1 over sizes[order] (non-increasing): (flat, offsets) of the non-empty bins; "
        "refine=True adds our refinement of the leftovers (refine.h).");
  m.def(("pack" + suffix).c_str(), &pack<T>, py::arg("sizes"), py::arg("order"),
        py::arg("capacity"), py::arg("num_ranks"), py::arg("refine") = false,
        "Algorithm 1 (refine: + our refinement), bins made a multiple of num_ranks and ordered by "
        "load: (flat, offsets).");
  m.def(("rebalance" + suffix).c_str(), &rebalance<T>, py::arg("sizes"), py::arg("flat"),
        py::arg("offsets"), py::arg("capacity"), py::arg("num_ranks"),
        "Our step rebalancing: steps below 0.999 balance dealt again by LPT within capacity.");
  m.def(("finalize" + suffix).c_str(), &finalize<T>, py::arg("sizes"), py::arg("flat"),
        py::arg("offsets"), py::arg("num_ranks"),
        "Bins made a multiple of num_ranks and ordered by load: (flat, offsets).");
  m.def(("order_descending" + suffix).c_str(), &order_descending<T>, py::arg("sizes"),
        py::arg("candidates"), py::arg("seed") = -1,
        "Order of candidates by size, descending: stable, or ties shuffled from seed >= 0.");
  m.def(("oversize_partners" + suffix).c_str(), &oversize_partners<T>, py::arg("cumulative"),
        py::arg("big_sizes"), py::arg("num_ranks"), py::arg("fill"),
        "The partner bin runs of the oversize graphs' steps: (placed per graph, run ends).");
  define_peers<T>(m, suffix);
}

}  // namespace
}  // namespace cfm_balance

PYBIND11_MODULE(_balance, m) {
  m.doc() = "Bin packing for balanced mini-batches: Algorithm 1 and its peers (CSR outputs).";
  // One set per size type (the Python side picks by dtype): _i64 for integer sizes, _f64 for
  // real-valued costs. forcecast only converts layout here, never the meaning of a size.
  cfm_balance::define_all<cfm_balance::i64>(m, "_i64");
  cfm_balance::define_all<double>(m, "_f64");
}
