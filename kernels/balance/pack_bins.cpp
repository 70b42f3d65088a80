// cfmtrain._balance: the paper's Algorithm 1 (section 3.2, SPEC pseudocode) over numpy arrays, no
// per-graph Python objects; templated on int64 and float64 sizes. The peers are in peers.cpp.
//
// Algorithm 1 is computed exactly as the pseudocode (the Python reference in
// cfmtrain/balance/algorithm1.py gives identical bins) but without re-sorting the active bins
// every iteration. Two facts make that possible when sizes are visited in non-increasing order:
//  (a) after a walk the active list is still sorted by remaining capacity (a fuller bin received
//      a larger or equal graph), so the next stable sort is the identity unless full bins returned;
//  (b) in a walk over a cap-sorted list the bins marked full form a prefix (cap < current size) and
//      every later bin receives one graph.
// So an iteration costs O(marked + assigned), and the full bins live in buckets keyed by capacity
// (ties keep the order of the full list). A return merges active bins with the buckets of capacity
// >= the current size; buckets below it stay full, the active bins marked in that walk go in front
// of them (the stable sort puts active before full). Total O((n + B) log B) per round.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.h"

namespace cfm_balance {
namespace {

// One round of Algorithm 1 over the graphs of sizes ss[0:n] (non-increasing, contiguous).
template <typename T>
class Round {
 public:
  Round(const T* ss, i64 n, T capacity, i64 bins, std::vector<i64>& bin_of)
      : ss_(ss), n_(n), cap_(bins, capacity), active_(bins), next_link_(bins, -1),
        bin_of_(bin_of) {
    std::iota(active_.begin(), active_.end(), 0);
    next_active_.reserve(bins);
  }

  // Assigns a prefix of the graphs, returns its length; bin_of[q] is the bin of graph q.
  i64 run() {
    while (p_ < n_ && !active_.empty()) {
      const T s = ss_[p_];
      size_t i = 0;  // (b): the marked prefix of the (sorted) active list
      while (i < active_.size() && cap_[active_[i]] < s) ++i;
      mark_full(i);
      next_active_.clear();
      if (returned_) {
        walk_merged(i, s);
      } else {
        for (size_t a = i; p_ < n_ && a < active_.size(); ++a) give(active_[a]);
      }
      active_.swap(next_active_);
      // Return when an active bin is fuller than the least-filled full bin.
      returned_ = p_ < n_ && !full_.empty() && !active_.empty() &&
                  cap_[active_.front()] < full_.rbegin()->first;
    }
    return p_;
  }

 private:
  // The first `count` active bins join the full list: at its end after an ordinary walk; after
  // a return before the full bins of equal capacity (the stable sort put active bins first).
  void mark_full(size_t count) {
    for (size_t k = 0; k < count; ++k) {
      const i64 b = active_[returned_ ? count - 1 - k : k];
      auto it = full_.find(cap_[b]);
      next_link_[b] = -1;
      if (it == full_.end()) {
        full_.emplace(cap_[b], std::make_pair(b, b));
      } else if (returned_) {
        next_link_[b] = it->second.first;
        it->second.first = b;
      } else {
        next_link_[it->second.second] = b;
        it->second.second = b;
      }
    }
  }

  // After a return: the rest of the active list merged with the full buckets of capacity >= s
  // (by capacity, active bins first), each given the next graph.
  void walk_merged(size_t a, T s) {
    auto it = full_.lower_bound(s);
    const auto first_taken = it;
    i64 f = it == full_.end() ? -1 : it->second.first;
    while (p_ < n_ && (a < active_.size() || f >= 0)) {
      if (f < 0 || (a < active_.size() && cap_[active_[a]] <= it->first)) {
        give(active_[a++]);
      } else {
        const i64 b = f;
        f = next_link_[b];
        give(b);
        if (f < 0 && ++it != full_.end()) f = it->second.first;
      }
    }
    full_.erase(first_taken, full_.end());  // all taken, or the round is over
  }

  void give(i64 b) {
    bin_of_[p_] = b;
    cap_[b] -= ss_[p_];
    ++p_;
    next_active_.push_back(b);
  }

  const T* ss_;
  const i64 n_;
  std::vector<T> cap_;
  std::vector<i64> active_, next_active_, next_link_;
  std::map<T, std::pair<i64, i64>> full_;  // capacity -> (head, tail) of a list via next_link_
  std::vector<i64>& bin_of_;
  bool returned_ = false;
  i64 p_ = 0;
};

// Algorithm 1's result: for each graph in visiting order, its bin among the emitted bins (the
// non-empty bins of each round, in round and bin order), and each emitted bin's count and load.
template <typename T>
struct Assignment {
  std::vector<i64> bin_of, count;
  std::vector<T> load;
};

// Bins in CSR form with the load of each bin.
template <typename T>
struct LoadedBins {
  std::vector<i64> flat, offsets{0};
  std::vector<T> load;
};

// Sizes in visiting order, contiguous (the gather is paid once), with the inputs checked.
template <typename T>
std::vector<T> visiting_sizes(const T* size, i64 num_sizes, const i64* ord, i64 n, T capacity) {
  std::vector<T> ss(n);
  for (i64 q = 0; q < n; ++q) {
    if (ord[q] < 0 || ord[q] >= num_sizes)
      throw std::invalid_argument("order holds an index outside sizes");
    const T s = ss[q] = size[ord[q]];
    if (!(s >= 0) || s > capacity) {
      std::ostringstream msg;
      msg << "graph " << ord[q] << " has size " << s << ", outside [0, capacity " << capacity
          << "]";
      throw std::invalid_argument(msg.str());
    }
    if (q > 0 && s > ss[q - 1])
      throw std::invalid_argument("sizes must be non-increasing along order");
  }
  return ss;
}

// The whole of Algorithm 1: rounds over the leftovers. Call without the GIL.
template <typename T>
Assignment<T> run_algorithm1(const T* size, i64 num_sizes, const i64* ord, i64 n, T capacity,
                             i64 num_ranks) {
  const std::vector<T> ss = visiting_sizes(size, num_sizes, ord, n, capacity);
  Assignment<T> out;
  out.bin_of.resize(n);
  std::vector<i64> local(n), emitted;
  std::vector<T> load;
  for (i64 done = 0; done < n;) {
    T total = 0;
    for (i64 q = done; q < n; ++q) total += ss[q];
    const i64 multiple = (ceil_div_total(total, capacity) + num_ranks - 1) / num_ranks;
    const i64 bins = std::max(num_ranks, multiple * num_ranks);
    const i64 p = Round<T>(ss.data() + done, n - done, capacity, bins, local).run();
    emitted.assign(bins, 0);
    load.assign(bins, 0);
    for (i64 q = 0; q < p; ++q) {
      ++emitted[local[q]];
      load[local[q]] += ss[done + q];
    }
    for (i64 b = 0; b < bins; ++b) {  // number the non-empty bins
      if (emitted[b] == 0) continue;
      out.count.push_back(emitted[b]);
      out.load.push_back(load[b]);
      emitted[b] = static_cast<i64>(out.count.size()) - 1;
    }
    for (i64 q = 0; q < p; ++q) out.bin_of[done + q] = emitted[local[q]];
    done += p;
  }
  return out;
}

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

template <typename T>
Assignment<T> run_checked(const Arr<T>& sizes, const Arr<i64>& order, T capacity, i64 num_ranks) {
  const T* size = data_1d(sizes, "sizes");
  const i64* ord = data_1d(order, "order");
  if (!(capacity > 0)) throw std::invalid_argument("capacity must be positive");
  if (num_ranks < 1) throw std::invalid_argument("num_ranks must be at least 1");
  py::gil_scoped_release nogil;
  return run_algorithm1(size, sizes.shape(0), ord, order.shape(0), capacity, num_ranks);
}

// Algorithm 1 as the pseudocode emits it: (flat, offsets) of the non-empty bins.
template <typename T>
py::tuple algorithm1(const Arr<T>& sizes, const Arr<i64>& order, T capacity, i64 num_ranks) {
  LoadedBins<T> bins = to_loaded_bins(run_checked(sizes, order, capacity, num_ranks),
                                      order.data());
  Csr out;
  out.flat = std::move(bins.flat);
  out.offsets = std::move(bins.offsets);
  return to_numpy(std::move(out));
}

// Algorithm 1 made into steps, as finalize_bins does; when the bins are already a multiple of
// num_ranks (the usual case) the graphs go straight to their place in the heaviest-first order.
template <typename T>
py::tuple pack(const Arr<T>& sizes, const Arr<i64>& order, T capacity, i64 num_ranks) {
  Assignment<T> as = run_checked(sizes, order, capacity, num_ranks);
  if (as.count.size() % num_ranks != 0)
    return finalize_bins(to_loaded_bins(std::move(as), order.data()), sizes.data(), num_ranks);
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
  }
  return py::make_tuple(flat, offsets);
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
        py::arg("capacity"), py::arg("num_ranks"),
        "Algorithm 1 over sizes[order] (non-increasing): (flat, offsets) of the non-empty bins.");
  m.def(("pack" + suffix).c_str(), &pack<T>, py::arg("sizes"), py::arg("order"),
        py::arg("capacity"), py::arg("num_ranks"),
        "Algorithm 1, bins made a multiple of num_ranks and ordered by load: (flat, offsets).");
  m.def(("finalize" + suffix).c_str(), &finalize<T>, py::arg("sizes"), py::arg("flat"),
        py::arg("offsets"), py::arg("num_ranks"),
        "Bins made a multiple of num_ranks and ordered by load: (flat, offsets).");
  m.def(("order_descending" + suffix).c_str(), &order_descending<T>, py::arg("sizes"),
        py::arg("candidates"), py::arg("seed") = -1,
        "Order of candidates by size, descending: stable, or ties shuffled from seed >= 0.");
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
