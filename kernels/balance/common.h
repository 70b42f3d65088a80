// Shared pieces of cfmtrain._balance: numpy arrays in, CSR bins out, index checks, the RNG.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace cfm_balance {

namespace py = pybind11;
using i64 = int64_t;

template <typename T>
using Arr = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
const T* data_1d(const Arr<T>& a, const char* name) {
  if (a.ndim() != 1) throw std::invalid_argument(std::string(name) + " must be one-dimensional");
  return a.data();
}

inline void check_indices(const i64* idx, i64 n, i64 num_sizes, const char* name) {
  for (i64 q = 0; q < n; ++q)
    if (idx[q] < 0 || idx[q] >= num_sizes)
      throw std::invalid_argument(std::string(name) + " holds an index outside sizes");
}

// Bins in CSR form: bin k holds flat[offsets[k]:offsets[k+1]].
struct Csr {
  std::vector<i64> flat;
  std::vector<i64> offsets{0};
  void close_bin() { offsets.push_back(static_cast<i64>(flat.size())); }
};

inline py::tuple to_numpy(Csr&& csr) {
  auto flat = py::array_t<i64>(static_cast<py::ssize_t>(csr.flat.size()));
  auto offs = py::array_t<i64>(static_cast<py::ssize_t>(csr.offsets.size()));
  std::copy(csr.flat.begin(), csr.flat.end(), flat.mutable_data());
  std::copy(csr.offsets.begin(), csr.offsets.end(), offs.mutable_data());
  return py::make_tuple(flat, offs);
}

// ceil(total / capacity), exact for integers.
inline i64 ceil_div_total(i64 total, i64 capacity) { return (total + capacity - 1) / capacity; }
inline i64 ceil_div_total(double total, double capacity) {
  return static_cast<i64>(std::ceil(total / capacity));
}

// splitmix64: a small, fully specified generator, so a seed gives the same order everywhere.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t bound) {  // uniform in [0, bound), Lemire's method with rejection
    uint64_t x = next();
    unsigned __int128 m = static_cast<unsigned __int128>(x) * bound;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        x = next();
        m = static_cast<unsigned __int128>(x) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
};

// The peers' packing loops (peers.cpp), registered with the given name suffix.
template <typename T>
void define_peers(py::module_& m, const std::string& suffix);

}  // namespace cfm_balance
