// The peers' packing loops for cfmtrain._balance (see cfmtrain/balance/strategies.py): greedy
// next fit (fairchem, PyG, HydraGNN), first fit (FFD with decreasing order), and fairchem's
// longest-processing-time partition. Each returns CSR bins (flat, offsets).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <tuple>
#include <vector>

#include "common.h"

namespace cfm_balance {
namespace {

// Greedy next fit in the given order (fairchem get_batches, PyG DynamicBatchSampler, HydraGNN
// CostAwareBatchSampler): close the batch when the next graph would overflow the capacity or the
// batch already holds max_graphs (0 = no limit). A graph above capacity gets a batch of its own.
template <typename T>
py::tuple next_fit(const Arr<T>& sizes, const Arr<i64>& order, T capacity, i64 max_graphs) {
  const T* size = data_1d(sizes, "sizes");
  const i64* ord = data_1d(order, "order");
  const i64 n = order.shape(0);
  check_indices(ord, n, sizes.shape(0), "order");
  Csr out;
  out.flat.reserve(n);
  T load = 0;
  i64 count = 0;
  for (i64 q = 0; q < n; ++q) {
    const T s = size[ord[q]];
    const bool overflow = load + s > capacity || (max_graphs > 0 && count >= max_graphs);
    if (count > 0 && (overflow || s > capacity)) {
      out.close_bin();
      load = 0;
      count = 0;
    }
    out.flat.push_back(ord[q]);
    load += s;
    ++count;
    if (s > capacity) {
      out.close_bin();
      load = 0;
      count = 0;
    }
  }
  if (count > 0) out.close_bin();
  return to_numpy(std::move(out));
}

// First fit in the given order (decreasing sizes make it FFD): a max segment tree over the bins'
// remaining capacity finds the lowest-numbered bin that can hold each graph in O(log bins).
template <typename T>
py::tuple first_fit(const Arr<T>& sizes, const Arr<i64>& order, T capacity) {
  const T* size = data_1d(sizes, "sizes");
  const i64* ord = data_1d(order, "order");
  const i64 n = order.shape(0);
  T total = 0;
  for (i64 q = 0; q < n; ++q) {
    if (ord[q] < 0 || ord[q] >= sizes.shape(0))
      throw std::invalid_argument("order holds an index outside sizes");
    total += size[ord[q]];
  }
  // Any first fit leaves at most one bin half empty: bins <= 2 * total / capacity + 1.
  const i64 bound = std::min<i64>(n, 2 * ceil_div_total(total, capacity) + 1);
  i64 leaves = 1;
  while (leaves < std::max<i64>(bound, 1)) leaves *= 2;
  std::vector<T> tree(2 * leaves, capacity);  // every bin starts empty (a bin opens on first use)
  std::vector<i64> bin_of(n);
  i64 used = 0;
  for (i64 q = 0; q < n; ++q) {
    const T s = size[ord[q]];
    if (s > capacity) throw std::invalid_argument("first_fit: a graph exceeds the capacity");
    if (tree[1] < s) throw std::logic_error("first_fit: bin bound exceeded");
    i64 node = 1;
    while (node < leaves) node = tree[2 * node] >= s ? 2 * node : 2 * node + 1;
    const i64 b = node - leaves;
    bin_of[q] = b;
    used = std::max(used, b + 1);
    tree[node] -= s;
    for (node /= 2; node >= 1; node /= 2) tree[node] = std::max(tree[2 * node], tree[2 * node + 1]);
  }
  std::vector<i64> start(used + 1, 0);
  for (i64 q = 0; q < n; ++q) ++start[bin_of[q] + 1];
  for (i64 b = 0; b < used; ++b) start[b + 1] += start[b];
  Csr out;
  out.offsets.assign(start.begin(), start.end());
  out.flat.resize(n);
  for (i64 q = 0; q < n; ++q) out.flat[start[bin_of[q]]++] = ord[q];
  return to_numpy(std::move(out));
}

// Longest processing time first within each group flat[offsets[g]:offsets[g+1]] (fairchem
// _balanced_partition): the group's graphs by decreasing size, each to the part with the smallest
// load (ties: the part whose first graph has the smaller index, as Python compares its heap
// entries). Returns parts * groups bins, group-major; part k of a group starts with its k-th
// largest graph.
template <typename T>
py::tuple lpt_groups(const Arr<T>& sizes, const Arr<i64>& flat, const Arr<i64>& offsets,
                     i64 parts) {
  const T* size = data_1d(sizes, "sizes");
  const i64* idx = data_1d(flat, "flat");
  const i64* off = data_1d(offsets, "offsets");
  if (parts < 1) throw std::invalid_argument("parts must be at least 1");
  const i64 groups = offsets.shape(0) - 1;
  check_indices(idx, flat.shape(0), sizes.shape(0), "flat");
  if (groups < 0 || off[0] != 0 || off[groups] != flat.shape(0))
    throw std::invalid_argument("offsets must run from 0 to len(flat)");
  for (i64 g = 0; g < groups; ++g)
    if (off[g + 1] < off[g]) throw std::invalid_argument("offsets must not decrease");
  Csr out;
  out.flat.reserve(flat.shape(0));
  std::vector<i64> members, part_of;
  std::vector<std::vector<i64>> bins(parts);
  using Entry = std::tuple<T, i64, i64>;  // (load, first graph, part)
  for (i64 g = 0; g < groups; ++g) {
    members.assign(idx + off[g], idx + off[g + 1]);
    std::stable_sort(members.begin(), members.end(),
                     [size](i64 x, i64 y) { return size[x] > size[y]; });
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    for (auto& b : bins) b.clear();
    for (size_t k = 0; k < members.size(); ++k) {
      if (static_cast<i64>(k) < parts) {
        bins[k].push_back(members[k]);
        heap.emplace(size[members[k]], members[k], static_cast<i64>(k));
        continue;
      }
      auto [load, first, part] = heap.top();
      heap.pop();
      bins[part].push_back(members[k]);
      heap.emplace(load + size[members[k]], first, part);
    }
    for (auto& b : bins) {
      out.flat.insert(out.flat.end(), b.begin(), b.end());
      out.close_bin();
    }
  }
  return to_numpy(std::move(out));
}

}  // namespace

template <typename T>
void define_peers(py::module_& m, const std::string& suffix) {
  m.def(("next_fit" + suffix).c_str(), &next_fit<T>, py::arg("sizes"), py::arg("order"),
        py::arg("capacity"), py::arg("max_graphs") = 0,
        "Greedy next fit in the given order: (flat, offsets).");
  m.def(("first_fit" + suffix).c_str(), &first_fit<T>, py::arg("sizes"), py::arg("order"),
        py::arg("capacity"), "First fit in the given order: (flat, offsets).");
  m.def(("lpt_groups" + suffix).c_str(), &lpt_groups<T>, py::arg("sizes"), py::arg("flat"),
        py::arg("offsets"), py::arg("parts"),
        "LPT partition of each group into parts: (flat, offsets).");
}

template void define_peers<i64>(py::module_&, const std::string&);
template void define_peers<double>(py::module_&, const std::string&);

}  // namespace cfm_balance
