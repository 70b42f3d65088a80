// A mace-torch batch assembled in one call from a graph store's concatenated arrays (held in
// memory): every field of the graphs `graphs`, in order, the way mace-torch's Collater
// concatenates their AtomicData. Python (cfmtrain/train/batching.py) names the outputs.
#include <torch/library.h>
#include <ATen/ATen.h>

#include <cstring>
#include <vector>

namespace cfmtrain::batch {
namespace {

void check(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim) {
  TORCH_CHECK(t.defined() && t.device().is_cpu() && t.is_contiguous(), "assemble_batch: ", name,
              " must be a contiguous CPU tensor");
  TORCH_CHECK(t.scalar_type() == dtype, "assemble_batch: ", name, " must be ", dtype, ", got ",
              t.scalar_type());
  TORCH_CHECK(t.dim() == dim, "assemble_batch: ", name, " must be ", dim, "-D, got ", t.sizes());
}

// rows [start[g], start[g] + count[g]) of `src` ([rows, width]) for each graph g of `graphs`,
// concatenated into `dst`
template <typename T>
void copy_ranges(const T* src, T* dst, int64_t width, const int64_t* graphs, int64_t n,
                 const int64_t* start, const int64_t* count) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = graphs[i], rows = count[g] * width;
    std::memcpy(dst, src + start[g] * width, rows * sizeof(T));
    dst += rows;
  }
}

// The edges of the graphs, in one pass over each graph's edge range: edge_index (int32,
// graph-local atoms) -> int64 batch atoms, integer unit shifts -> floats, and the shifts
// unit_shifts @ cell of the edge's graph, as train.cells.edge_shifts computes them in F:
// (u0 * c0 + u1 * c1) + u2 * c2, no fused multiply-add (the same rounding as torch's).
template <typename F, typename I>
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
void edge_ranges(const int32_t* index, int64_t stored_edges, const I* unit, const F* cells,
                 const int64_t* graphs, int64_t n, const int64_t* start, const int64_t* count,
                 const int64_t* ptr, int64_t edges, int64_t* index_out, F* unit_out,
                 F* shift_out) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  int64_t* senders = index_out;
  int64_t* receivers = index_out + edges;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = graphs[i], first = start[g], rows = count[g], offset = ptr[i];
    const int32_t* s = index + first;
    const int32_t* r = index + stored_edges + first;
    for (int64_t k = 0; k < rows; ++k) senders[k] = s[k] + offset;
    for (int64_t k = 0; k < rows; ++k) receivers[k] = r[k] + offset;
    senders += rows;
    receivers += rows;
    const I* u = unit + first * 3;
    const F* c = cells + g * 9;
    for (int64_t k = 0; k < rows; ++k, u += 3, unit_out += 3, shift_out += 3) {
      const F u0 = F(u[0]), u1 = F(u[1]), u2 = F(u[2]);
      unit_out[0] = u0, unit_out[1] = u1, unit_out[2] = u2;
      for (int d = 0; d < 3; ++d) {
        const F a = u0 * c[d], b = u1 * c[3 + d], e = u2 * c[6 + d];
        shift_out[d] = (a + b) + e;
      }
    }
  }
}

template <typename F>
std::vector<at::Tensor> assemble(const at::Tensor& graphs, const at::Tensor& atom_start,
                                 const at::Tensor& num_atoms, const at::Tensor& edge_start,
                                 const at::Tensor& num_edges, const at::Tensor& species,
                                 int64_t num_classes, const std::vector<at::Tensor>& atom_fields,
                                 const at::Tensor& edge_index, const at::Tensor& unit_shifts,
                                 const at::Tensor& cells,
                                 const std::vector<at::Tensor>& graph_fields,
                                 const std::optional<at::Tensor>& weights) {
  const auto fopt = at::TensorOptions().dtype(c10::CppTypeToScalarType<F>::value);
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  const int64_t n = graphs.size(0), stored = num_atoms.size(0);
  const int64_t stored_atoms = species.size(0), stored_edges = edge_index.size(1);
  const int64_t* g = graphs.data_ptr<int64_t>();
  const int64_t *na = num_atoms.data_ptr<int64_t>(), *ne = num_edges.data_ptr<int64_t>();
  const int64_t *as = atom_start.data_ptr<int64_t>(), *es = edge_start.data_ptr<int64_t>();
  at::Tensor ptr = at::empty({n + 1}, lopt);
  int64_t* p = ptr.data_ptr<int64_t>();
  p[0] = 0;
  int64_t edges = 0;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(g[i] >= 0 && g[i] < stored, "assemble_batch: graph ", g[i], " is outside [0, ",
                stored, ")");
    TORCH_CHECK(as[g[i]] >= 0 && as[g[i]] + na[g[i]] <= stored_atoms && es[g[i]] >= 0 &&
                    es[g[i]] + ne[g[i]] <= stored_edges,
                "assemble_batch: graph ", g[i], "'s rows lie outside the arrays");
    p[i + 1] = p[i] + na[g[i]];
    edges += ne[g[i]];
  }
  const int64_t atoms = p[n];

  std::vector<at::Tensor> out;
  at::Tensor batch = at::empty({atoms}, lopt);
  int64_t* b = batch.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) std::fill(b + p[i], b + p[i + 1], i);
  out.push_back(batch);
  out.push_back(ptr);

  // species -> one-hot node attributes; a negative species is an element the model lacks
  at::Tensor attrs = at::zeros({atoms, num_classes}, fopt);
  F* a = attrs.data_ptr<F>();
  const int64_t* s = species.data_ptr<int64_t>();
  for (int64_t i = 0, row = 0; i < n; ++i)
    for (int64_t k = as[g[i]]; k < as[g[i]] + na[g[i]]; ++k, ++row) {
      TORCH_CHECK(s[k] >= 0 && s[k] < num_classes, "assemble_batch: unknown element in graph ",
                  g[i]);
      a[row * num_classes + s[k]] = F(1);
    }
  out.push_back(attrs);

  for (const auto& field : atom_fields) {  // [stored atoms, width]
    at::Tensor t = at::empty({atoms, field.size(1)}, fopt);
    copy_ranges(field.data_ptr<F>(), t.data_ptr<F>(), field.size(1), g, n, as, na);
    out.push_back(t);
  }

  // edge_index [2, stored edges] (int32, graph-local atoms) -> [2, edges] int64 batch atoms;
  // unit shifts (int8/16/32) -> F; shifts = unit shifts @ the edge's graph's cell
  at::Tensor index = at::empty({2, edges}, lopt);
  at::Tensor unit = at::empty({edges, 3}, fopt);
  at::Tensor shifts = at::empty({edges, 3}, fopt);
  const int32_t* src = edge_index.data_ptr<int32_t>();
  const F* c = cells.data_ptr<F>();
  auto run = [&](const auto* u) {
    edge_ranges(src, stored_edges, u, c, g, n, es, ne, p, edges, index.data_ptr<int64_t>(),
                unit.data_ptr<F>(), shifts.data_ptr<F>());
  };
  switch (unit_shifts.scalar_type()) {
    case at::kChar: run(unit_shifts.data_ptr<int8_t>()); break;
    case at::kShort: run(unit_shifts.data_ptr<int16_t>()); break;
    case at::kInt: run(unit_shifts.data_ptr<int32_t>()); break;
    default: TORCH_CHECK(false, "assemble_batch: unit_shifts must be int8, int16 or int32, got ",
                         unit_shifts.scalar_type());
  }
  out.push_back(index);
  out.push_back(unit);
  out.push_back(shifts);

  for (const auto& field : graph_fields) {  // [stored graphs, *shape], any dtype
    std::vector<int64_t> shape(field.sizes().begin(), field.sizes().end());
    shape[0] = n;
    at::Tensor t = at::empty(shape, field.options());
    const int64_t row = field.numel() / stored * field.element_size();
    const char* from = static_cast<const char*>(field.const_data_ptr());
    char* to = static_cast<char*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) std::memcpy(to + i * row, from + g[i] * row, row);
    out.push_back(t);
  }

  out.push_back(weights.has_value() ? weights->clone() : at::ones({n}, fopt));
  // mace-torch's constant fields, in CONSTANTS order (batching.py)
  for (auto shape : std::vector<std::vector<int64_t>>{{n, 3, 3}, {n, 3, 3}, {n, 3}, {n, 3}, {n},
                                                      {n}, {n}, {atoms}, {atoms, 1}})
    out.push_back(at::zeros(shape, fopt));
  out.push_back(at::zeros({n}, lopt));  // head
  for (auto shape : std::vector<std::vector<int64_t>>{{n}, {n}, {n}, {n}, {n}, {n, 3}, {n, 3, 3}})
    out.push_back(at::ones(shape, fopt));
  return out;
}

std::vector<at::Tensor> assemble_batch(
    const at::Tensor& graphs, const at::Tensor& atom_start, const at::Tensor& num_atoms,
    const at::Tensor& edge_start, const at::Tensor& num_edges, const at::Tensor& species,
    int64_t num_classes, at::TensorList atom_fields, const at::Tensor& edge_index,
    const at::Tensor& unit_shifts, const at::Tensor& cells, at::TensorList graph_fields,
    const std::optional<at::Tensor>& weights) {
  for (const auto* t : {&graphs, &atom_start, &num_atoms, &edge_start, &num_edges, &species})
    check(*t, "an index", at::kLong, 1);
  check(edge_index, "edge_index", at::kInt, 2);
  TORCH_CHECK(unit_shifts.is_contiguous() && unit_shifts.dim() == 2 && unit_shifts.size(1) == 3,
              "assemble_batch: unit_shifts must be contiguous [edges, 3], got ",
              unit_shifts.sizes());
  TORCH_CHECK(edge_index.size(0) == 2 && edge_index.size(1) == unit_shifts.size(0),
              "assemble_batch: edge_index must be [2, edges] beside unit_shifts [edges, 3]");
  TORCH_CHECK(atom_fields.size() > 0, "assemble_batch: no atom fields");
  const auto dtype = atom_fields[0].scalar_type();
  for (const auto& t : atom_fields) {
    check(t, "an atom field", dtype, 2);
    TORCH_CHECK(t.size(0) == species.size(0), "assemble_batch: an atom field has ", t.size(0),
                " rows, species ", species.size(0));
  }
  check(cells, "cells", dtype, 3);
  TORCH_CHECK(cells.size(0) == num_atoms.size(0) && cells.size(1) == 3 && cells.size(2) == 3,
              "assemble_batch: cells must be [stored graphs, 3, 3], got ", cells.sizes());
  for (const auto& t : graph_fields)
    TORCH_CHECK(t.is_contiguous() && t.dim() >= 1 && t.size(0) == num_atoms.size(0),
                "assemble_batch: a graph field must be contiguous with one row per stored graph");
  if (weights.has_value()) check(*weights, "weights", dtype, 1);
  const std::vector<at::Tensor> af(atom_fields.begin(), atom_fields.end()),
      gf(graph_fields.begin(), graph_fields.end());
  if (dtype == at::kFloat)
    return assemble<float>(graphs, atom_start, num_atoms, edge_start, num_edges, species,
                           num_classes, af, edge_index, unit_shifts, cells, gf, weights);
  TORCH_CHECK(dtype == at::kDouble, "assemble_batch: fields must be float32 or float64, got ",
              dtype);
  return assemble<double>(graphs, atom_start, num_atoms, edge_start, num_edges, species,
                          num_classes, af, edge_index, unit_shifts, cells, gf, weights);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cfmtrain, m) {
  m.def("assemble_batch(Tensor graphs, Tensor atom_start, Tensor num_atoms, Tensor edge_start, "
        "Tensor num_edges, Tensor species, int num_classes, Tensor[] atom_fields, "
        "Tensor edge_index, Tensor unit_shifts, Tensor cells, Tensor[] graph_fields, "
        "Tensor? weights) "
        "-> Tensor[]");
}

TORCH_LIBRARY_IMPL(cfmtrain, CPU, m) { m.impl("assemble_batch", &assemble_batch); }

}  // namespace cfmtrain::batch
