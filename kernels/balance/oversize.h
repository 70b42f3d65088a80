// Partners of the oversize graphs' steps for cfmtrain._balance (cfmtrain/balance/pack.py,
// oversize_steps): the greedy scan over the pooled bins, compiled, since it runs every epoch
// for every oversize graph and rank.
#pragma once

#include <algorithm>
#include <vector>

#include "common.h"

namespace cfm_balance {

// For each oversize graph in the given order (largest first) with size big_sizes[g]: num_ranks
// - 1 consecutive runs of the pool's bins, each the most bins whose load stays within the
// graph's size and reaches `fill` of it; cumulative[i] is the load of pool bins 0..i. A graph
// whose partners cannot all be filled is left alone (placed false) and takes no bins. Returns
// (placed per graph, the runs' end positions in the pool: num_ranks - 1 per placed graph).
template <typename T>
py::tuple oversize_partners(const Arr<T>& cumulative, const Arr<T>& big_sizes, i64 num_ranks,
                            double fill) {
  const T* cum = data_1d(cumulative, "cumulative");
  const T* size = data_1d(big_sizes, "big_sizes");
  const i64 n = cumulative.shape(0), m = big_sizes.shape(0), partners = num_ranks - 1;
  if (partners < 1) throw std::invalid_argument("oversize partners need num_ranks >= 2");
  auto placed = py::array_t<bool>(static_cast<py::ssize_t>(m));
  bool* is_placed = placed.mutable_data();
  std::vector<i64> ends, run(static_cast<size_t>(partners));
  i64 taken = 0;
  for (i64 g = 0; g < m; ++g) {
    i64 end = taken, k = 0;
    for (; k < partners; ++k) {
      const T before = end ? cum[end - 1] : T(0);
      const i64 stop = std::upper_bound(cum, cum + n, before + size[g]) - cum;
      if (stop == end || static_cast<double>(cum[stop - 1] - before) < fill * size[g]) break;
      run[static_cast<size_t>(k)] = stop;
      end = stop;
    }
    is_placed[g] = k == partners;
    if (is_placed[g]) {
      ends.insert(ends.end(), run.begin(), run.end());
      taken = end;
    }
  }
  auto out = py::array_t<i64>(static_cast<py::ssize_t>(ends.size()));
  std::copy(ends.begin(), ends.end(), out.mutable_data());
  return py::make_tuple(placed, out);
}

}  // namespace cfm_balance
