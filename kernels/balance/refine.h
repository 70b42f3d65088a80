// Our refinement of Algorithm 1's leftovers (not in the paper), for the goal "bins at most the
// lower bound plus R". Algorithm 1 ends a round at the first graph that fits in no bin and packs
// what is left into new bins, at least R of them: on the 2.65M-graph mixture with R = 8 the first
// round leaves ~80k atoms in 0-4 atom gaps of its 96,560 bins (the lower bound: 1,750 atoms of
// slack in all), and the leftovers take 32 bins more.
//
// The refinement keeps, in each first-round bin, the graphs larger than a threshold t; pools the
// others (the graphs <= t: a suffix of the visiting order, holding every leftover); refills the
// first-round bins in order, each with the largest pooled graph that still fits, until none fits;
// and gives what stays pooled to Algorithm 1 again. t starts at the largest leftover and doubles,
// 8 attempts at most; the first result within the lower bound + R is kept (else the one with the
// fewest steps), and only when it has fewer steps than Algorithm 1. Exact like Algorithm 1: no bin
// over capacity, every graph once; it depends on the sizes in visiting order only, so graphs of
// equal size stay interchangeable (the randomised variant keeps its loads).

#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "algorithm1.h"
#include "common.h"

namespace cfm_balance {

constexpr int kRefineAttempts = 8;  // thresholds t0, 2 t0, ..., 128 t0

inline i64 round_up(i64 bins, i64 num_ranks) {
  return (bins + num_ranks - 1) / num_ranks * num_ranks;
}

// The pooled graphs, positions [q0, n) of ss (non-increasing): "the largest available graph of
// size <= c" in O(log n) via a union-find over the pool (item k <-> position n - k; 0 = none).
template <typename T>
class Pool {
 public:
  Pool(const T* ss, i64 q0, i64 n) : ss_(ss), q0_(q0), n_(n), up_(n - q0 + 1) {
    std::iota(up_.begin(), up_.end(), 0);
  }
  // Position of the largest available graph of size <= c (the earliest of equal ones), or -1.
  i64 largest_within(T c) {
    const T* first = std::partition_point(ss_ + q0_, ss_ + n_, [c](T s) { return s > c; });
    const i64 k = find(n_ - (first - ss_));
    return k == 0 ? -1 : n_ - k;
  }
  void take(i64 q) { up_[n_ - q] = n_ - q - 1; }
  bool available(i64 q) { return find(n_ - q) == n_ - q; }

 private:
  i64 find(i64 k) {
    while (up_[k] != k) k = up_[k] = up_[up_[k]];
    return k;
  }
  const T* ss_;
  const i64 q0_, n_;
  std::vector<i64> up_;
};

// Bins numbered in order of first appearance among bin_of's values (non-empty ones only).
template <typename T>
Assignment<T> numbered(const T* ss, const std::vector<i64>& bin_of, i64 max_bins) {
  std::vector<i64> number(max_bins, -1);
  Assignment<T> out;
  out.bin_of.resize(bin_of.size());
  std::vector<i64> used(max_bins, 0);
  for (i64 b : bin_of) used[b] = 1;
  for (i64 b = 0; b < max_bins; ++b) {
    if (!used[b]) continue;
    number[b] = static_cast<i64>(out.count.size());
    out.count.push_back(0);
    out.load.push_back(0);
  }
  for (size_t q = 0; q < bin_of.size(); ++q) {
    const i64 b = out.bin_of[q] = number[bin_of[q]];
    ++out.count[b];
    out.load[b] += ss[q];
  }
  return out;
}

// One attempt with threshold t: the first-round bins refilled from the pool, the rest packed anew.
template <typename T>
Assignment<T> refill(const T* ss, i64 n, T capacity, i64 num_ranks, const Assignment<T>& alg,
                     T threshold) {
  const i64 q0 = std::partition_point(ss, ss + n, [threshold](T s) { return s > threshold; }) - ss;
  const i64 bins = alg.first_round_bins;
  std::vector<i64> bin_of(n);
  std::vector<T> load(bins, 0);
  for (i64 q = 0; q < q0; ++q) load[bin_of[q] = alg.bin_of[q]] += ss[q];
  Pool<T> pool(ss, q0, n);
  for (i64 b = 0; b < bins; ++b) {
    T room = capacity - load[b];
    for (i64 q; (q = pool.largest_within(room)) >= 0;) {
      if (load[b] + ss[q] > capacity) {  // a rounding step of real sizes: try smaller graphs
        room = std::nextafter(ss[q], -std::numeric_limits<T>::infinity());
        continue;
      }
      pool.take(q);
      bin_of[q] = b;
      load[b] += ss[q];
      room = capacity - load[b];
    }
  }
  std::vector<i64> rest;
  std::vector<T> rest_sizes;
  for (i64 q = q0; q < n; ++q)
    if (pool.available(q)) rest.push_back(q), rest_sizes.push_back(ss[q]);
  const Assignment<T> again = algorithm1_rounds(rest_sizes.data(),
                                                static_cast<i64>(rest.size()), capacity, num_ranks);
  for (size_t k = 0; k < rest.size(); ++k) bin_of[rest[k]] = bins + again.bin_of[k];
  return numbered(ss, bin_of, bins + static_cast<i64>(again.count.size()));
}

// Algorithm 1's assignment, or the refined one when that has fewer steps (see above).
template <typename T>
Assignment<T> refine_leftovers(const T* ss, i64 n, T capacity, i64 num_ranks,
                               Assignment<T>&& alg) {
  const i64 steps_alg = round_up(static_cast<i64>(alg.count.size()), num_ranks);
  if (alg.first_round_graphs == n) return std::move(alg);
  T total = 0;
  for (i64 q = 0; q < n; ++q) total += ss[q];
  const i64 bound = bins_needed(total, capacity, num_ranks);
  Assignment<T> best;
  i64 best_bins = steps_alg;
  T t = ss[alg.first_round_graphs];
  for (int attempt = 0; attempt < kRefineAttempts && best_bins > bound + num_ranks; ++attempt) {
    Assignment<T> candidate = refill(ss, n, capacity, num_ranks, alg, t);
    const i64 got = round_up(static_cast<i64>(candidate.count.size()), num_ranks);
    if (got < best_bins) best = std::move(candidate), best_bins = got;
    if (!(t < ss[0])) break;  // every graph was pooled
    t = t * 2;
  }
  return best_bins < steps_alg ? std::move(best) : std::move(alg);
}

}  // namespace cfm_balance
