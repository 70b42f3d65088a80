// Channelwise ('uvu') conv tensor product fused with the gather from senders and the scatter-sum to
// receivers: input checks, device dispatch and the op schemas (work in cpu/channelwise_conv_cpu.cpp).
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "cpu/channelwise_conv_cpu.h"

namespace cfmtrain::conv {
namespace {

void check_tensor(const at::Tensor& t, const char* name, int64_t dim, at::ScalarType dtype) {
  TORCH_CHECK(t.defined(), "channelwise_conv: ", name, " is undefined");
  TORCH_CHECK(t.dim() == dim, "channelwise_conv: ", name, " must be ", dim, "-D, got shape ",
              t.sizes());
  TORCH_CHECK(t.scalar_type() == dtype, "channelwise_conv: ", name, " must be ", dtype, ", got ",
              t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "channelwise_conv: ", name, " must be contiguous");
  TORCH_CHECK(t.device().is_cpu(), "channelwise_conv: ", name, " must be on the CPU, got ",
              t.device());
}

void check_floats(const at::Tensor& t, const char* name, int64_t rows, int64_t cols,
                  at::ScalarType dtype) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble,
              "channelwise_conv: ", name, " must be float32 or float64, got ", t.scalar_type());
  check_tensor(t, name, 2, dtype);
  TORCH_CHECK(rows < 0 || t.size(0) == rows, "channelwise_conv: ", name, " must have ", rows,
              " rows, got ", t.size(0));
  TORCH_CHECK(t.size(1) == cols, "channelwise_conv: ", name, " must have ", cols,
              " columns, got ", t.size(1));
}

void check_index(const at::Tensor& t, const char* name, int64_t n, int64_t bound) {
  check_tensor(t, name, 1, at::kLong);
  TORCH_CHECK(t.size(0) == n, "channelwise_conv: ", name, " must have ", n, " entries, got ",
              t.size(0));
  const int64_t* p = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(p[i] >= 0 && p[i] < bound, "channelwise_conv: ", name, "[", i, "] = ", p[i],
                " is outside [0, ", bound, ")");
}

// rowptr: monotone from 0 to E; perm: a permutation of the edges.
void check_csr(const at::Tensor& rowptr, const at::Tensor& perm, const char* rname,
               const char* pname, int64_t n_edges) {
  check_tensor(rowptr, rname, 1, at::kLong);
  TORCH_CHECK(rowptr.size(0) >= 1, "channelwise_conv: ", rname, " must have at least one entry");
  const int64_t* r = rowptr.data_ptr<int64_t>();
  TORCH_CHECK(r[0] == 0 && r[rowptr.size(0) - 1] == n_edges, "channelwise_conv: ", rname,
              " must run from 0 to the number of edges ", n_edges);
  for (int64_t i = 1; i < rowptr.size(0); ++i)
    TORCH_CHECK(r[i] >= r[i - 1], "channelwise_conv: ", rname, " decreases at ", i);
  check_index(perm, pname, n_edges, n_edges);
  std::vector<char> seen(n_edges, 0);
  const int64_t* p = perm.data_ptr<int64_t>();
  for (int64_t i = 0; i < n_edges; ++i) {
    TORCH_CHECK(!seen[p[i]], "channelwise_conv: ", pname, " repeats edge ", p[i]);
    seen[p[i]] = 1;
  }
}

Graph check_graph(const at::Tensor& sender, const at::Tensor& receiver,
                  const at::Tensor& recv_rowptr, const at::Tensor& recv_perm,
                  const at::Tensor& send_rowptr, const at::Tensor& send_perm, int64_t n_edges) {
  check_csr(recv_rowptr, recv_perm, "recv_rowptr", "recv_perm", n_edges);
  check_csr(send_rowptr, send_perm, "send_rowptr", "send_perm", n_edges);
  check_index(sender, "sender", n_edges, send_rowptr.size(0) - 1);
  check_index(receiver, "receiver", n_edges, recv_rowptr.size(0) - 1);
  return {sender, receiver, recv_rowptr, recv_perm, send_rowptr, send_perm};
}

// Every path's blocks must lie inside their rows; the weight segments must tile the weight row.
Descriptor check_descriptor(const at::Tensor& paths, const at::Tensor& terms,
                            const at::Tensor& coeffs, at::IntArrayRef dims) {
  TORCH_CHECK(dims.size() == 4, "channelwise_conv: dims must be (x_dim, y_dim, w_dim, o_dim)");
  check_tensor(paths, "paths", 2, at::kLong);
  check_tensor(terms, "terms", 2, at::kLong);
  check_tensor(coeffs, "coeffs", 1, at::kDouble);
  TORCH_CHECK(paths.size(1) == 10, "channelwise_conv: paths must have 10 columns");
  TORCH_CHECK(terms.size(1) == 3 && coeffs.size(0) == terms.size(0),
              "channelwise_conv: terms must be [T, 3] with T coeffs");
  auto P = paths.accessor<int64_t, 2>();
  auto Tm = terms.accessor<int64_t, 2>();
  int64_t w_next = 0;
  for (int64_t p = 0; p < P.size(0); ++p) {
    const int64_t mul = P[p][0];
    TORCH_CHECK(mul > 0 && P[p][1] >= 0 && P[p][1] + P[p][2] * mul <= dims[0] &&
                    P[p][3] >= 0 && P[p][3] + P[p][4] <= dims[1] && P[p][5] == w_next &&
                    P[p][6] >= 0 && P[p][6] + P[p][7] * mul <= dims[3],
                "channelwise_conv: paths row ", p, " is outside dims ", dims);
    w_next += mul;
    TORCH_CHECK(0 <= P[p][8] && P[p][8] <= P[p][9] && P[p][9] <= terms.size(0),
                "channelwise_conv: paths row ", p, " has a bad term range");
    for (int64_t t = P[p][8]; t < P[p][9]; ++t)
      TORCH_CHECK(Tm[t][0] >= 0 && Tm[t][0] < P[p][2] && Tm[t][1] >= 0 && Tm[t][1] < P[p][4] &&
                      Tm[t][2] >= 0 && Tm[t][2] < P[p][7],
                  "channelwise_conv: terms row ", t, " is outside path ", p);
  }
  TORCH_CHECK(w_next == dims[2], "channelwise_conv: path weights cover ", w_next, " of ", dims[2],
              " weight columns");
  return {paths, terms, coeffs, dims.vec()};
}

// Stored weights [E, w_dim], or factored ones: weight [E, K] (hidden) with basis [K, w_dim], and
// optionally their rows weight[recv_perm] @ basis already formed, [E, w_dim].
Weights check_weights(const at::Tensor& weight, const std::optional<at::Tensor>& basis,
                      const std::optional<at::Tensor>& rows, int64_t n_edges, int64_t w_dim,
                      at::ScalarType dtype) {
  if (!basis.has_value()) {
    TORCH_CHECK(!rows.has_value(),
                "channelwise_conv: formed rows need factored weights (a basis)");
    check_floats(weight, "edge_weight", n_edges, w_dim, dtype);
    return {weight, at::Tensor(), at::Tensor()};
  }
  check_floats(*basis, "basis", -1, w_dim, dtype);
  check_floats(weight, "edge_weight", n_edges, basis->size(0), dtype);
  if (rows.has_value()) check_floats(*rows, "rows", n_edges, w_dim, dtype);
  return {weight, *basis, rows.value_or(at::Tensor())};
}

at::Tensor gather(const at::Tensor& src, const at::Tensor& edge_attr,
                  const at::Tensor& edge_weight, const std::optional<at::Tensor>& basis,
                  const std::optional<at::Tensor>& rows, const at::Tensor& sender,
                  const at::Tensor& receiver, const at::Tensor& recv_rowptr,
                  const at::Tensor& recv_perm, const at::Tensor& send_rowptr,
                  const at::Tensor& send_perm,
                  const at::Tensor& paths, const at::Tensor& terms, const at::Tensor& coeffs,
                  at::IntArrayRef dims, bool transpose) {
  const Descriptor desc = check_descriptor(paths, terms, coeffs, dims);
  const auto dtype = src.scalar_type();
  check_floats(src, "src", -1, transpose ? dims[3] : dims[0], dtype);
  check_floats(edge_attr, "edge_attr", -1, dims[1], dtype);
  const int64_t n_edges = edge_attr.size(0);
  TORCH_CHECK(!transpose || !rows.has_value(),
              "channelwise_conv: formed rows (receiver order) are for the message, not its "
              "transpose");
  const Weights weights = check_weights(edge_weight, basis, rows, n_edges, dims[2], dtype);
  const Graph graph = check_graph(sender, receiver, recv_rowptr, recv_perm, send_rowptr,
                                  send_perm, n_edges);
  const int64_t n_source = (transpose ? recv_rowptr : send_rowptr).size(0) - 1;
  TORCH_CHECK(src.size(0) == n_source, "channelwise_conv: src must have ", n_source,
              " rows (one per node), got ", src.size(0));
  return gather_cpu(src, edge_attr, weights, graph, desc, transpose);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> edge(
    const at::Tensor& x, const at::Tensor& edge_attr, const at::Tensor& edge_weight,
    const at::Tensor& grad, const std::optional<at::Tensor>& basis,
    const std::optional<at::Tensor>& rows, const at::Tensor& sender,
    const at::Tensor& receiver, const at::Tensor& recv_rowptr, const at::Tensor& recv_perm,
    const at::Tensor& send_rowptr, const at::Tensor& send_perm, const at::Tensor& paths,
    const at::Tensor& terms, const at::Tensor& coeffs, at::IntArrayRef dims, bool need_attr,
    bool need_weight, bool need_basis, bool need_x, bool need_out) {
  const Descriptor desc = check_descriptor(paths, terms, coeffs, dims);
  const auto dtype = x.scalar_type();
  check_floats(x, "x", send_rowptr.size(0) - 1, dims[0], dtype);
  check_floats(edge_attr, "edge_attr", -1, dims[1], dtype);
  const int64_t n_edges = edge_attr.size(0);
  const Weights weights = check_weights(edge_weight, basis, rows, n_edges, dims[2], dtype);
  check_floats(grad, "grad", recv_rowptr.size(0) - 1, dims[3], dtype);
  const Graph graph = check_graph(sender, receiver, recv_rowptr, recv_perm, send_rowptr,
                                  send_perm, n_edges);
  return edge_cpu(x, edge_attr, weights, grad, graph, desc, need_attr, need_weight, need_basis,
                  need_x, need_out);
}

// Forms of one edge pass: x, edge_attr, grad per form (shaped as in `edge`), and per form the
// slots asked of it as bits: 1 attribute, 2 x, 4 message.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> edge_forms(
    at::TensorList xs, at::TensorList edge_attrs, at::TensorList grads,
    const at::Tensor& edge_weight, const std::optional<at::Tensor>& basis,
    const std::optional<at::Tensor>& rows, const at::Tensor& sender, const at::Tensor& receiver,
    const at::Tensor& recv_rowptr, const at::Tensor& recv_perm, const at::Tensor& send_rowptr,
    const at::Tensor& send_perm,
    const at::Tensor& paths, const at::Tensor& terms, const at::Tensor& coeffs,
    at::IntArrayRef dims, at::IntArrayRef slots, bool need_weight, bool need_basis,
    const std::optional<at::Tensor>& weight_grad_in, bool emit_weight_grad) {
  const Descriptor desc = check_descriptor(paths, terms, coeffs, dims);
  const size_t n = xs.size();
  TORCH_CHECK(n >= 1 && edge_attrs.size() == n && grads.size() == n && slots.size() == n,
              "channelwise_conv: xs, edge_attrs, grads and slots must have one entry per form "
              "(at least one), got ", n, ", ", edge_attrs.size(), ", ", grads.size(), ", ",
              slots.size());
  const auto dtype = xs[0].scalar_type();
  check_floats(edge_attrs[0], "edge_attrs[0]", -1, dims[1], dtype);
  const int64_t n_edges = edge_attrs[0].size(0);
  const Weights weights = check_weights(edge_weight, basis, rows, n_edges, dims[2], dtype);
  const Graph graph = check_graph(sender, receiver, recv_rowptr, recv_perm, send_rowptr,
                                  send_perm, n_edges);
  std::vector<EdgeForm> forms;
  for (size_t f = 0; f < n; ++f) {
    const std::string i = "[" + std::to_string(f) + "]";
    check_floats(xs[f], ("xs" + i).c_str(), send_rowptr.size(0) - 1, dims[0], dtype);
    check_floats(edge_attrs[f], ("edge_attrs" + i).c_str(), n_edges, dims[1], dtype);
    check_floats(grads[f], ("grads" + i).c_str(), recv_rowptr.size(0) - 1, dims[3], dtype);
    TORCH_CHECK(slots[f] >= 0 && slots[f] < 8, "channelwise_conv: slots", i, " = ", slots[f],
                " is not a combination of 1 (attribute), 2 (x) and 4 (message)");
    forms.push_back({xs[f], edge_attrs[f], grads[f], (slots[f] & 1) != 0, (slots[f] & 2) != 0,
                     (slots[f] & 4) != 0});
  }
  if (weight_grad_in.has_value())
    check_floats(*weight_grad_in, "weight_grad_in", n_edges, dims[2], dtype);
  return edge_forms_cpu(forms, weights, graph, desc, need_weight, need_basis,
                        weight_grad_in.value_or(at::Tensor()), emit_weight_grad);
}

}  // namespace
}  // namespace cfmtrain::conv

TORCH_LIBRARY_FRAGMENT(cfmtrain, m) {
  m.def(
      "channelwise_conv_gather(Tensor src, Tensor edge_attr, Tensor edge_weight, "
      "Tensor? basis, Tensor? rows, Tensor sender, Tensor receiver, Tensor recv_rowptr, "
      "Tensor recv_perm, Tensor send_rowptr, Tensor send_perm, Tensor paths, Tensor terms, "
      "Tensor coeffs, int[] dims, bool transpose) -> Tensor");
  m.def(
      "channelwise_conv_edge(Tensor x, Tensor edge_attr, Tensor edge_weight, Tensor grad, "
      "Tensor? basis, Tensor? rows, Tensor sender, Tensor receiver, Tensor recv_rowptr, "
      "Tensor recv_perm, Tensor send_rowptr, Tensor send_perm, Tensor paths, Tensor terms, "
      "Tensor coeffs, int[] dims, bool need_attr, bool need_weight, bool need_basis, "
      "bool need_x, bool need_out) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "channelwise_conv_edge_forms(Tensor[] xs, Tensor[] edge_attrs, Tensor[] grads, "
      "Tensor edge_weight, Tensor? basis, Tensor? rows, Tensor sender, Tensor receiver, "
      "Tensor recv_rowptr, Tensor recv_perm, Tensor send_rowptr, Tensor send_perm, "
      "Tensor paths, Tensor terms, Tensor coeffs, int[] dims, int[] slots, bool need_weight, "
      "bool need_basis, Tensor? weight_grad_in=None, bool emit_weight_grad=False) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(cfmtrain, CPU, m) {
  m.impl("channelwise_conv_gather", &cfmtrain::conv::gather);
  m.impl("channelwise_conv_edge", &cfmtrain::conv::edge);
  m.impl("channelwise_conv_edge_forms", &cfmtrain::conv::edge_forms);
}
