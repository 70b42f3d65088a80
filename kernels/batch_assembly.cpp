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

// integer unit shifts [stored edges, 3] of the graphs' edge ranges -> floats, concatenated
template <typename F, typename I>
void convert_ranges(const I* src, F* dst, const int64_t* graphs, int64_t n, const int64_t* start,
                    const int64_t* count) {
  for (int64_t i = 0; i < n; ++i) {
    const I* from = src + start[graphs[i]] * 3;
    for (int64_t k = 0; k < count[graphs[i]] * 3; ++k) *dst++ = F(from[k]);
  }
}

template <typename F>
std::vector<at::Tensor> assemble(const at::Tensor& graphs, const at::Tensor& atom_start,
                                 const at::Tensor& num_atoms, const at::Tensor& edge_start,
                                 const at::Tensor& num_edges, const at::Tensor& species,
                                 int64_t num_classes, const std::vector<at::Tensor>& atom_fields,
                                 const at::Tensor& edge_index, const at::Tensor& unit_shifts,
                                 const std::vector<at::Tensor>& edge_fields,
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

  // edge_index [2, stored edges] (int32, graph-local atoms) -> [2, edges] int64 batch atoms
  at::Tensor index = at::empty({2, edges}, lopt);
  const int32_t* src = edge_index.data_ptr<int32_t>();
  const int64_t total = edge_index.size(1);
  int64_t* dst = index.data_ptr<int64_t>();
  for (int64_t row = 0; row < 2; ++row)
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* from = src + row * total + es[g[i]];
      const int64_t offset = p[i];
      for (int64_t k = 0; k < ne[g[i]]; ++k) *dst++ = from[k] + offset;
    }
  out.push_back(index);

  at::Tensor unit = at::empty({edges, 3}, fopt);
  F* u = unit.data_ptr<F>();
  switch (unit_shifts.scalar_type()) {
    case at::kChar: convert_ranges(unit_shifts.data_ptr<int8_t>(), u, g, n, es, ne); break;
    case at::kShort: convert_ranges(unit_shifts.data_ptr<int16_t>(), u, g, n, es, ne); break;
    case at::kInt: convert_ranges(unit_shifts.data_ptr<int32_t>(), u, g, n, es, ne); break;
    default: TORCH_CHECK(false, "assemble_batch: unit_shifts must be int8, int16 or int32, got ",
                         unit_shifts.scalar_type());
  }
  out.push_back(unit);

  for (const auto& field : edge_fields) {  // [stored edges, width]
    at::Tensor t = at::empty({edges, field.size(1)}, fopt);
    copy_ranges(field.data_ptr<F>(), t.data_ptr<F>(), field.size(1), g, n, es, ne);
    out.push_back(t);
  }

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
    const at::Tensor& unit_shifts, at::TensorList edge_fields, at::TensorList graph_fields,
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
  for (const auto& t : edge_fields) {
    check(t, "an edge field", dtype, 2);
    TORCH_CHECK(t.size(0) == edge_index.size(1), "assemble_batch: an edge field has ", t.size(0),
                " rows, edge_index ", edge_index.size(1));
  }
  for (const auto& t : graph_fields)
    TORCH_CHECK(t.is_contiguous() && t.dim() >= 1 && t.size(0) == num_atoms.size(0),
                "assemble_batch: a graph field must be contiguous with one row per stored graph");
  if (weights.has_value()) check(*weights, "weights", dtype, 1);
  const std::vector<at::Tensor> af(atom_fields.begin(), atom_fields.end()),
      ef(edge_fields.begin(), edge_fields.end()), gf(graph_fields.begin(), graph_fields.end());
  if (dtype == at::kFloat)
    return assemble<float>(graphs, atom_start, num_atoms, edge_start, num_edges, species,
                           num_classes, af, edge_index, unit_shifts, ef, gf, weights);
  TORCH_CHECK(dtype == at::kDouble, "assemble_batch: fields must be float32 or float64, got ",
              dtype);
  return assemble<double>(graphs, atom_start, num_atoms, edge_start, num_edges, species,
                          num_classes, af, edge_index, unit_shifts, ef, gf, weights);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cfmtrain, m) {
  m.def("assemble_batch(Tensor graphs, Tensor atom_start, Tensor num_atoms, Tensor edge_start, "
        "Tensor num_edges, Tensor species, int num_classes, Tensor[] atom_fields, "
        "Tensor edge_index, Tensor unit_shifts, Tensor[] edge_fields, Tensor[] graph_fields, Tensor? weights) "
        "-> Tensor[]");
}

TORCH_LIBRARY_IMPL(cfmtrain, CPU, m) { m.impl("assemble_batch", &assemble_batch); }

}  // namespace cfmtrain::batch
