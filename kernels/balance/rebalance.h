// Our second refinement (not in the paper), for the goal "step balance at least 0.999": when the
// plan misses it, each step whose R bins are uneven (mean load / max load below 0.999) has its
// graphs dealt again by longest-processing-time first (largest graph first, each to the bin with
// the least load, then the fewest graphs, then the lowest number), then polished by swaps between
// the heaviest and the lightest bin. The new split is kept only when every bin stays within
// capacity and the step's largest load drops; its bins are then listed heaviest first.
// Algorithm 1 leaves uneven steps where bins outnumber the work (few graphs per rank, e.g. 10k
// graphs on 740 ranks: bins a multiple of R, fullest-first filling); elsewhere nothing changes.

#pragma once

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <tuple>
#include <vector>

#include "common.h"

namespace cfm_balance {

constexpr i64 kPolishRounds = 4;  // swaps per bin of a step, at most

// Swaps (or moves) between the most and the least loaded bin (lowest numbers on ties) while one
// narrows their gap: the pair whose size difference d (0 < d < gap) is closest to gap / 2, the
// first in the order (graph of the heaviest bin, then: moved alone, or swapped with each graph of
// the lightest bin). Both loads stay strictly between the old ones: capacity holds, no bin empties.
template <typename T>
void polish(const T* size, i64 num_ranks, std::vector<std::vector<i64>>& bins,
            std::vector<T>& load) {
  for (i64 round = 0; round < kPolishRounds * num_ranks; ++round) {
    const i64 hi = std::max_element(load.begin(), load.end()) - load.begin();
    const i64 lo = std::min_element(load.begin(), load.end()) - load.begin();
    const T gap = load[hi] - load[lo];
    i64 best_i = -1, best_j = -1;
    T best = 0;
    for (size_t i = 0; i < bins[hi].size(); ++i) {
      for (i64 j = -1; j < static_cast<i64>(bins[lo].size()); ++j) {
        const T d = size[bins[hi][i]] - (j < 0 ? T(0) : size[bins[lo][j]]);
        if (!(d > 0 && d < gap)) continue;
        const T miss = d + d > gap ? d + d - gap : gap - d - d;
        if (best_i < 0 || miss < best) best_i = static_cast<i64>(i), best_j = j, best = miss;
      }
    }
    if (best_i < 0) return;
    const i64 g = bins[hi][best_i];
    const T out = size[g], in = best_j < 0 ? T(0) : size[bins[lo][best_j]];
    if (best_j < 0) {
      bins[hi].erase(bins[hi].begin() + best_i);
    } else {
      bins[hi][best_i] = bins[lo][best_j];
      bins[lo].erase(bins[lo].begin() + best_j);
    }
    bins[lo].push_back(g);
    load[hi] = load[hi] - out + in;
    load[lo] = load[lo] - in + out;
  }
}

// The step's graphs flat[lo:hi] dealt into its R bins by LPT then polished, or false if one would
// overflow.
template <typename T>
bool deal_step(const T* size, const i64* flat, i64 lo, i64 hi, i64 num_ranks, T capacity,
               std::vector<std::vector<i64>>& bins, std::vector<T>& load) {
  std::vector<i64> graphs(flat + lo, flat + hi);
  std::stable_sort(graphs.begin(), graphs.end(),
                   [size](i64 x, i64 y) { return size[x] > size[y]; });
  using Entry = std::tuple<T, i64, i64>;  // (load, graphs, bin): the smallest first
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  bins.assign(num_ranks, {});
  load.assign(num_ranks, 0);
  for (i64 b = 0; b < num_ranks; ++b) heap.emplace(T(0), 0, b);
  for (const i64 g : graphs) {
    auto [l, c, b] = heap.top();
    if (l + size[g] > capacity) return false;
    heap.pop();
    bins[b].push_back(g);
    load[b] = l + size[g];
    heap.emplace(load[b], c + 1, b);
  }
  polish(size, num_ranks, bins, load);
  return true;
}

constexpr double kStepTarget = 0.999;  // the goal for the plan's step balance

// Mean load over max load of each step (1 for a step without load); bin loads from `bin_load`
// when given (in plan order), else summed from the plan.
template <typename T>
std::vector<double> step_ratios(const T* size, const i64* flat, const i64* offsets, i64 steps,
                                i64 num_ranks, const T* bin_load) {
  std::vector<double> ratio(steps, 1.0);
  for (i64 s = 0; s < steps; ++s) {
    const i64* off = offsets + s * num_ranks;
    T top = 0, sum = 0;
    for (i64 r = 0; r < num_ranks; ++r) {
      T load = 0;
      if (bin_load != nullptr) {
        load = bin_load[s * num_ranks + r];
      } else {
        for (i64 q = off[r]; q < off[r + 1]; ++q) load += size[flat[q]];
      }
      top = std::max(top, load);
      sum += load;
    }
    if (top > 0) ratio[s] = static_cast<double>(sum) / num_ranks / static_cast<double>(top);
  }
  return ratio;
}

// When the plan's step balance (mean of the step ratios) is below `target`, every step below it
// is dealt again, in place (flat, offsets[0:bins+1]; bins s*R .. s*R+R-1 are step s). `bin_load`:
// the bins' loads in plan order if known (as the sums of their sizes in plan order).
template <typename T>
void rebalance_steps(const T* size, i64* flat, i64* offsets, i64 bins, i64 num_ranks, T capacity,
                     const T* bin_load = nullptr, double target = kStepTarget) {
  const i64 steps = num_ranks > 1 ? bins / num_ranks : 0;
  const std::vector<double> ratio = step_ratios(size, flat, offsets, steps, num_ranks, bin_load);
  if (std::accumulate(ratio.begin(), ratio.end(), 0.0) >= target * static_cast<double>(steps))
    return;
  std::vector<std::vector<i64>> dealt;
  std::vector<T> load;
  std::vector<i64> by_load(num_ranks);
  for (i64 s = 0; s < steps; ++s) {
    if (ratio[s] >= target) continue;
    const i64* off = offsets + s * num_ranks;
    T top = 0;
    for (i64 r = 0; r < num_ranks; ++r) {
      T before = 0;
      for (i64 q = off[r]; q < off[r + 1]; ++q) before += size[flat[q]];
      top = std::max(top, before);
    }
    if (!deal_step(size, flat, off[0], off[num_ranks], num_ranks, capacity, dealt, load)) continue;
    // the loads summed afresh in bin order, as `top` is: the running sums of the deal and the
    // polish can sit an ulp below, which would keep a split that does not lower the real maximum
    for (i64 r = 0; r < num_ranks; ++r) {
      load[r] = 0;
      for (const i64 g : dealt[r]) load[r] += size[g];
    }
    if (!(*std::max_element(load.begin(), load.end()) < top)) continue;
    std::iota(by_load.begin(), by_load.end(), 0);
    std::stable_sort(by_load.begin(), by_load.end(), [&load](i64 x, i64 y) {
      return load[x] > load[y];
    });
    i64 q = off[0];
    for (i64 r = 0; r < num_ranks; ++r) {
      const std::vector<i64>& bin = dealt[by_load[r]];
      std::copy(bin.begin(), bin.end(), flat + q);
      q += static_cast<i64>(bin.size());
      offsets[s * num_ranks + r + 1] = q;
    }
  }
}

}  // namespace cfm_balance
