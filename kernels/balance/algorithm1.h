// The paper's Algorithm 1 (section 3.2, SPEC pseudocode) over sizes in visiting order, no per-graph
// Python objects; templated on int64 and float64 sizes. Bindings are in pack_bins.cpp.
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

#pragma once

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "common.h"

namespace cfm_balance {

// Bins of a round: max(R, ceil(total / C) rounded up to a multiple of R).
template <typename T>
i64 bins_needed(T total, T capacity, i64 num_ranks) {
  const i64 multiple = (ceil_div_total(total, capacity) + num_ranks - 1) / num_ranks;
  return std::max(num_ranks, multiple * num_ranks);
}

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
// first_round_*: the graphs (a prefix of the visiting order) and bins of the first round.
template <typename T>
struct Assignment {
  std::vector<i64> bin_of, count;
  std::vector<T> load;
  i64 first_round_graphs = 0, first_round_bins = 0;
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

// The whole of Algorithm 1 over sizes ss[0:n] (non-increasing): rounds over the leftovers.
template <typename T>
Assignment<T> algorithm1_rounds(const T* ss, i64 n, T capacity, i64 num_ranks) {
  Assignment<T> out;
  out.bin_of.resize(n);
  std::vector<i64> local(n), emitted;
  std::vector<T> load;
  for (i64 done = 0; done < n;) {
    T total = 0;
    for (i64 q = done; q < n; ++q) total += ss[q];
    const i64 bins = bins_needed(total, capacity, num_ranks);
    const i64 p = Round<T>(ss + done, n - done, capacity, bins, local).run();
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
    if (done == 0) {
      out.first_round_graphs = p;
      out.first_round_bins = static_cast<i64>(out.count.size());
    }
    done += p;
  }
  return out;
}

// Algorithm 1 over sizes[ord[0:n]]. Call without the GIL.
template <typename T>
Assignment<T> run_algorithm1(const T* size, i64 num_sizes, const i64* ord, i64 n, T capacity,
                             i64 num_ranks) {
  const std::vector<T> ss = visiting_sizes(size, num_sizes, ord, n, capacity);
  return algorithm1_rounds(ss.data(), n, capacity, num_ranks);
}

}  // namespace cfm_balance
