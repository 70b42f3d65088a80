// Channelwise ('uvu') conv tensor product fused with gather/scatter: CPU kernel entry points.
// Shared by kernels/channelwise_conv.cpp (checks, dispatch) and cpu/channelwise_conv_cpu.cpp (work).
#pragma once

#include <ATen/ATen.h>

namespace cfmtrain::conv {

// Edge structure of one batch: edges as (sender, receiver) and the two CSR views of them,
// by receiver (rowptr over receivers, perm = edge ids in receiver order) and by sender.
struct Graph {
  at::Tensor sender, receiver, recv_rowptr, recv_perm, send_rowptr, send_perm;
};

// The sparse trilinear form: paths int64 [P, 10] (mul, x_off, x_dim, y_off, y_dim, w_off, o_off,
// o_dim, term_begin, term_end), terms int64 [T, 3] (i, j, k), coeffs float64 [T];
// dims = (x_dim, y_dim, w_dim, o_dim) of the node feature, edge attribute, edge weight, message.
struct Descriptor {
  at::Tensor paths, terms, coeffs;
  std::vector<int64_t> dims;
};

// Per-edge weights: stored rows (basis undefined: weight is [E, w_dim]) or factored, weight @ basis
// with weight [E, K] (the radial MLP's last hidden layer) and basis [K, w_dim] (its last linear
// layer): then the rows are formed per chunk of edges inside the kernels, never stored whole,
// unless `rows` holds them already formed ([E, w_dim] in receiver-CSR order, row q for the edge
// recv_perm[q]); the gradients stay factored either way.
struct Weights {
  at::Tensor weight, basis, rows;
  bool factored() const { return basis.defined(); }
};

// Node-level contraction. transpose=false: message[r] = sum_{e->r} TP(src[sender[e]], attr[e],
// weight[e]) over the receiver CSR. transpose=true: the adjoint w.r.t. the node features,
// src is a message-shaped tensor at receivers and the result is feature-shaped at senders.
at::Tensor gather_cpu(const at::Tensor& src, const at::Tensor& edge_attr, const Weights& weights,
                      const Graph& graph, const Descriptor& desc, bool transpose);

// Edge-level contraction with grad (message-shaped, at receivers) and x (feature-shaped, at
// senders): returns (d<grad, message>/d attr, d<grad, message>/d weight, d<grad, message>/d
// basis, d<grad, message>/d x); for factored weights the weight slot is the hidden layer [E, K]
// and the basis one [K, w_dim] is summed over edges; d x is the transposed gather, summed over
// each sender's edges in the same receiver-ordered pass (per-thread sums); and the message
// itself (gather_cpu of x), from the same weight rows. An output not asked for is an empty
// tensor.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> edge_cpu(
    const at::Tensor& x, const at::Tensor& edge_attr, const Weights& weights,
    const at::Tensor& grad, const Graph& graph, const Descriptor& desc, bool need_attr,
    bool need_weight, bool need_basis, bool need_x, bool need_out);

// One conv form <grad, F(x, edge_attr, weights)> of a multi-form edge pass, with the slots asked
// of it besides the shared weight and basis slots.
struct EdgeForm {
  at::Tensor x, edge_attr, grad;
  bool need_attr, need_x, need_out;
};

// edge_cpu of several forms that share the weights, summed: every slot's output is the sum of the
// forms' outputs for it (the weight and basis slots over every form), from one pass that forms
// each weight row once, contracts the summed weight gradients once, and builds the per-receiver
// cotangent terms once per distinct grad tensor. Factored weights only: `weight_grad_in`
// ([E, w_dim], receiver-CSR order, or undefined) is added to the per-edge weight gradients before
// they are contracted; with `emit_weight_grad` they are not contracted but returned in the weight
// slot as [E, w_dim] rows in receiver-CSR order (the basis slot empty).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> edge_forms_cpu(
    const std::vector<EdgeForm>& forms, const Weights& weights, const Graph& graph,
    const Descriptor& desc, bool need_weight, bool need_basis, const at::Tensor& weight_grad_in,
    bool emit_weight_grad);

}  // namespace cfmtrain::conv
