"""Fused channelwise ('uvu') conv of MACE's interaction blocks: sender features x edge spherical
harmonics x per-edge radial weights, gathered from senders and summed into receivers in one op.

The conv is a 4-linear form <g, TP(x, Y, W)> summed over edges; each derivative leaves one slot open
and is again one of two compiled ops: `channelwise_conv_gather` (a node slot open: the message
over the receiver CSR, or its adjoint w.r.t. x over the sender CSR) and `channelwise_conv_edge`
(the attribute and weight slots open, per edge, and from the same pass the node slots too). So
every order of derivative runs these kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from e3nn import o3
from torch.autograd.graph import get_gradient_edge
from torch.utils.flop_counter import register_flop_formula

from cfmtrain.kernels.adopt import Adopting
from cfmtrain.kernels.backend import compiled_ops, ops_built
from cfmtrain.kernels.dense import dense_mm
from cfmtrain.kernels.radial import FoldedRadialMLP

FUSION_TAG = "cfmtrain"


_OPS = compiled_ops("cfmtrain._ops_channelwise_conv")  # ops raise at first call if not built


class ConvGraph(NamedTuple):
    """Edges of a batch and their CSR views by receiver and by sender (int64, CPU)."""

    sender: torch.Tensor
    receiver: torch.Tensor
    recv_rowptr: torch.Tensor
    recv_perm: torch.Tensor
    send_rowptr: torch.Tensor
    send_perm: torch.Tensor


@dataclass(frozen=True)
class ConvDescriptor:
    """The conv as paths of CG terms over ir_mul blocks (see kernels/cpu/channelwise_conv_cpu.h)."""

    paths: torch.Tensor  # int64 [P, 10]
    terms: torch.Tensor  # int64 [T, 3]
    coeffs: torch.Tensor  # float64 [T]
    dims: list[int]  # x_dim, y_dim, w_dim, o_dim
    x_order: tuple[torch.Tensor, torch.Tensor] | None  # mul_ir -> ir_mul columns (and inverse)
    o_order: tuple[torch.Tensor, torch.Tensor] | None  # of the features and of the message

    def args(self) -> tuple:
        return self.paths, self.terms, self.coeffs, self.dims


def _offsets(irreps: o3.Irreps) -> list[int]:
    out, off = [], 0
    for mul, ir in irreps:
        out.append(off)
        off += mul * ir.dim
    return out


def conv_descriptor(tp: o3.TensorProduct) -> ConvDescriptor:
    """Descriptor of an e3nn 'uvu' TensorProduct with per-edge weights (MACE's `conv_tp`)."""
    if tp.shared_weights or tp.internal_weights:
        raise ValueError("conv_descriptor: the TensorProduct must take per-edge external weights")
    x_off, y_off, o_off = (_offsets(i) for i in (tp.irreps_in1, tp.irreps_in2, tp.irreps_out))
    paths, terms, coeffs, w_off = [], [], [], 0
    for ins in tp.instructions:
        (mul, ir1), (mul2, ir2), (mul_o, ir_o) = (
            tp.irreps_in1[ins.i_in1], tp.irreps_in2[ins.i_in2], tp.irreps_out[ins.i_out])
        if ins.connection_mode != "uvu" or not ins.has_weight or mul2 != 1 or mul != mul_o:
            raise ValueError(f"conv_descriptor: unsupported instruction {ins} (need weighted "
                             "'uvu' with edge attributes of multiplicity 1)")
        if mul == 0:
            continue
        cg = o3.wigner_3j(ir1.l, ir2.l, ir_o.l, dtype=torch.float64) * ins.path_weight
        nonzero = (cg.abs() > 1e-14).nonzero().tolist()
        paths.append([mul, x_off[ins.i_in1], ir1.dim, y_off[ins.i_in2], ir2.dim, w_off,
                      o_off[ins.i_out], ir_o.dim, len(terms), len(terms) + len(nonzero)])
        terms += nonzero
        coeffs += [float(cg[i, j, k]) for i, j, k in nonzero]
        w_off += mul
    if w_off != tp.weight_numel:
        raise ValueError(f"conv_descriptor: paths use {w_off} of {tp.weight_numel} weights")
    return ConvDescriptor(
        paths=torch.tensor(paths, dtype=torch.int64).reshape(-1, 10),
        terms=torch.tensor(terms, dtype=torch.int64).reshape(-1, 3),
        coeffs=torch.tensor(coeffs, dtype=torch.float64),
        dims=[tp.irreps_in1.dim, tp.irreps_in2.dim, tp.weight_numel, tp.irreps_out.dim],
        x_order=_ir_mul_order(tp.irreps_in1), o_order=_ir_mul_order(tp.irreps_out))


def _ir_mul_order(irreps: o3.Irreps) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Column permutation (and its inverse) taking e3nn's mul_ir layout to ir_mul per block."""
    order, off = [], 0
    for mul, ir in irreps:
        order += [off + u * ir.dim + i for i in range(ir.dim) for u in range(mul)]
        off += mul * ir.dim
    order = torch.tensor(order, dtype=torch.int64)
    return None if torch.equal(order, torch.arange(len(order))) else (order, order.argsort())


class _Permute(torch.autograd.Function):
    """x[:, order]; the adjoint is the inverse permutation, so every derivative order is one."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        ctx.order, ctx.inverse = order, inverse
        return x.index_select(1, order)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _Permute.apply(grad, ctx.inverse, ctx.order), None, None


def _permute(x: torch.Tensor, order: tuple[torch.Tensor, torch.Tensor] | None,
             inverse: bool = False) -> torch.Tensor:
    if order is None:
        return x.contiguous()
    if torch.compiler.is_compiling():  # dynamo does not differentiate _Permute's backward
        return x.index_select(1, order[1] if inverse else order[0])
    return _Permute.apply(x, *(order[::-1] if inverse else order))


_graph_cache: list = []  # [(edge_index, version, num_nodes, ConvGraph)]: the last batch's graph


def _csr(index: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row pointers and edge order of the CSR by `index` (shapes fixed by num_nodes and E, so
    torch.compile traces it)."""
    perm = torch.argsort(index, stable=True)
    nodes = torch.arange(num_nodes + 1, dtype=index.dtype, device=index.device)
    return torch.searchsorted(index[perm], nodes), perm


def conv_graph(edge_index: torch.Tensor, num_nodes: int) -> ConvGraph:
    """CSR views of `edge_index` (2 x E: sender, receiver), built once per batch and cached
    (under torch.compile: built in the graph, unchecked)."""
    if torch.compiler.is_compiling():
        edges = edge_index.to(torch.int64)
        sender, receiver = edges[0].contiguous(), edges[1].contiguous()
        return ConvGraph(sender, receiver, *_csr(receiver, num_nodes), *_csr(sender, num_nodes))
    for cached, version, n, graph in _graph_cache:
        if cached is edge_index and version == edge_index._version and n == num_nodes:
            return graph
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape (2, E), got {tuple(edge_index.shape)}")
    if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool:
        raise ValueError(f"edge_index must hold integers, got {edge_index.dtype}")
    edges = edge_index.to(torch.int64)
    if edges.numel() and (edges.min() < 0 or edges.max() >= num_nodes):
        raise ValueError(f"edge_index has node ids outside [0, {num_nodes})")
    sender, receiver = edges[0].contiguous(), edges[1].contiguous()
    graph = ConvGraph(sender, receiver, *_csr(receiver, num_nodes), *_csr(sender, num_nodes))
    _graph_cache[:] = [(edge_index, edge_index._version, num_nodes, graph)]
    return graph


def _opt(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()


def conv_gather(src: torch.Tensor, attr: torch.Tensor, weight: torch.Tensor, graph: ConvGraph,
                desc: ConvDescriptor, transpose: bool, basis: torch.Tensor | None = None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
    """Node-level slot of the conv (ir_mul layout): the message, or its adjoint w.r.t. x. With a
    `basis` [K, w_dim] the weight is factored: `weight` [E, K] @ basis, formed in the kernel
    unless `rows` holds it formed (`formed_rows`; not for the transpose)."""
    return _OPS.channelwise_conv_gather(src.contiguous(), attr.contiguous(), weight.contiguous(),
                                        _opt(basis), _opt(rows), *graph, *desc.args(), transpose)


def conv_edge(x: torch.Tensor, attr: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor,
              graph: ConvGraph, desc: ConvDescriptor, need_attr: bool = True,
              need_weight: bool = True, basis: torch.Tensor | None = None,
              need_basis: bool = False, need_x: bool = False, need_out: bool = False,
              rows: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Edge-level slots: d<grad, message>/d attr (uses weight), d<grad, message>/d weight (uses
    attr), for a factored weight d<grad, message>/d basis; and, in the same pass, d<grad,
    message>/d x (the transposed gather) and d<grad, message>/d grad (the message itself, the
    gather of x); an output not asked for is empty. `rows`: the factored weight's rows, formed
    (`formed_rows`)."""
    return _OPS.channelwise_conv_edge(
        x.contiguous(), attr.contiguous(), weight.contiguous(), grad.contiguous(), _opt(basis),
        _opt(rows), *graph, *desc.args(), need_attr, need_weight, need_basis, need_x, need_out)


EdgeForm = tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool, bool, bool]
EdgeSlots = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def conv_edge_forms(forms: list[EdgeForm], weight: torch.Tensor, graph: ConvGraph,
                    desc: ConvDescriptor, need_weight: bool, basis: torch.Tensor | None = None,
                    need_basis: bool = False, rows: torch.Tensor | None = None,
                    weight_grad_in: torch.Tensor | None = None,
                    emit_weight_grad: bool = False) -> EdgeSlots:
    """`conv_edge` of several forms (x, attr, grad, need_attr, need_x, need_out) sharing the
    weights, summed slot by slot (weight and basis over every form), in one pass that forms each
    weight row once. Factored weights: `weight_grad_in` (per-edge weight gradients [E, w_dim],
    receiver-CSR order) is added to the pass's own before they are contracted into the weight and
    basis slots; `emit_weight_grad` returns the pass's own, uncontracted, in the weight slot
    instead. Not differentiable: a backward that builds a graph calls `conv_edge` per form."""
    xs, attrs, grads = ([f[i].contiguous() for f in forms] for i in range(3))
    slots = [int(f[3]) | 2 * int(f[4]) | 4 * int(f[5]) for f in forms]
    return _OPS.channelwise_conv_edge_forms(
        xs, attrs, grads, weight.contiguous(), _opt(basis), _opt(rows), *graph, *desc.args(),
        slots, need_weight, need_basis, _opt(weight_grad_in), emit_weight_grad)


# The most bytes of formed weight rows one conv keeps for the passes of a step (see formed_rows).
ROW_CACHE_BYTES = 1 << 30


def formed_rows(weight: torch.Tensor, basis: torch.Tensor, graph: ConvGraph) -> torch.Tensor | None:
    """The factored weights' rows, weight[recv_perm] @ basis (receiver-CSR order), formed once by
    one matmul for every pass of a step that reads them (the message, the forces' backward, the
    training backward), when a backward will follow (grad mode) and they fit in
    ROW_CACHE_BYTES; else None: each pass forms its rows chunk by chunk, never whole. A constant
    for autograd: the ops differentiate the factored weights, never the rows."""
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return None
    if weight.shape[0] * basis.shape[1] * weight.element_size() > ROW_CACHE_BYTES:
        return None
    with torch.no_grad():
        return dense_mm(weight.index_select(0, graph.recv_perm), basis)


def channelwise_conv(node_feats: torch.Tensor, edge_attrs: torch.Tensor, tp_weights: torch.Tensor,
                     graph: ConvGraph, desc: ConvDescriptor, basis: torch.Tensor | None = None,
                     ir_mul_out: bool = False, keep_rows: bool = False) -> torch.Tensor:
    """sum_{e: s->r} TP(node_feats[s], edge_attrs[e], tp_weights[e]) per receiver r (mul_ir, or
    the kernels' ir_mul with `ir_mul_out`); with `basis`, the weights are tp_weights @ basis,
    formed in the kernels, or with `keep_rows` once for the whole step by `formed_rows`."""
    if node_feats.device.type != "cpu":
        raise NotImplementedError(f"the fused conv runs on the CPU only, got {node_feats.device}; "
                                  "unfuse the model (cfmtrain.kernels.conv.unfuse_convs)")
    x = _permute(node_feats, desc.x_order)
    rows = formed_rows(tp_weights, basis, graph) if keep_rows and basis is not None else None
    out = conv_gather(x, edge_attrs, tp_weights, graph, desc, transpose=False, basis=basis,
                      rows=rows)
    return out if ir_mul_out else _permute(out, desc.o_order, inverse=True)


def _gather_fake(src, attr, weight, basis, rows, sender, receiver, recv_rowptr, recv_perm,
                 send_rowptr, send_perm, paths, terms, coeffs, dims, transpose):
    n = (send_rowptr if transpose else recv_rowptr).shape[0] - 1
    return src.new_empty((n, dims[0] if transpose else dims[3]))


def _edge_fake(x, attr, weight, grad, basis, rows, sender, receiver, recv_rowptr, recv_perm,
               send_rowptr, send_perm, paths, terms, coeffs, dims, need_attr, need_weight,
               need_basis, need_x, need_out):
    need_basis = need_basis and basis is not None
    return (attr.new_empty(attr.shape if need_attr else (0,)),
            weight.new_empty(weight.shape if need_weight else (0,)),
            weight.new_empty(basis.shape if need_basis else (0,)),
            x.new_empty(x.shape if need_x else (0,)),
            grad.new_empty(grad.shape if need_out else (0,)))


def _edge_forms_fake(xs, edge_attrs, grads, weight, basis, rows, sender, receiver, recv_rowptr,
                     recv_perm, send_rowptr, send_perm, paths, terms, coeffs, dims, slots,
                     need_weight, need_basis, weight_grad_in=None, emit_weight_grad=False):
    x, attr, grad = xs[0], edge_attrs[0], grads[0]
    if emit_weight_grad and basis is None:
        raise RuntimeError("channelwise_conv: emit_weight_grad needs factored weights")
    need_basis = need_basis and basis is not None
    gw_shape = ((attr.shape[0], basis.shape[1]) if emit_weight_grad
                else weight.shape if need_weight else (0,))
    return (attr.new_empty(attr.shape if any(s & 1 for s in slots) else (0,)),
            weight.new_empty(gw_shape),
            weight.new_empty(basis.shape if need_basis else (0,)),
            x.new_empty(x.shape if any(s & 2 for s in slots) else (0,)),
            grad.new_empty(grad.shape if any(s & 4 for s in slots) else (0,)))


def _path_sizes(paths: torch.Tensor, transpose: bool = False) -> tuple[torch.Tensor, ...]:
    """Per path (descriptor columns, see ConvDescriptor): channels, gathered and accumulated
    irrep dimensions (swapped by `transpose`), attribute dimension, CG terms."""
    x_dim, o_dim = paths[:, 2], paths[:, 7]
    d_in, d_out = (o_dim, x_dim) if transpose else (x_dim, o_dim)
    return paths[:, 0], d_in, d_out, paths[:, 4], paths[:, 9] - paths[:, 8]


def _gather_flops(src, attr, weight, basis, rows, sender, receiver, recv_rowptr, recv_perm,
                  send_rowptr, send_perm, paths, terms, coeffs, dims, transpose,
                  out_val=None) -> int:
    """FLOPs the gather kernel executes (torch.utils.flop_counter), per edge: per path the edge's
    matrix M = C . y (2 per CG term), the source row times the weight (in x channels) and M
    applied to it (2 in out channels); a factored weight forms its row (2 K w_dim) unless given
    formed."""
    mul, d_in, d_out, _, n_terms = _path_sizes(paths, transpose)
    per_edge = int((2 * n_terms + d_in * mul + 2 * d_in * d_out * mul).sum())
    forms = basis is not None and rows is None
    return sender.numel() * (per_edge + (2 * basis.numel() if forms else 0))


def _form_flops(paths: torch.Tensor, need_attr: bool, need_gw: bool, need_x: bool,
                need_out: bool) -> int:
    """Per-edge FLOPs of one form in the edge kernel, without forming factored weight rows."""
    mul, d_in, d_out, y_dim, n_terms = _path_sizes(paths)
    need_p = need_gw or need_attr
    return int((need_p * 2 * d_in * y_dim * mul + (need_gw + need_attr) * 2 * y_dim * mul
                + need_x * 2 * d_in * (y_dim + 1) * mul
                + need_out * (2 * n_terms + d_in * mul + 2 * d_in * d_out * mul)).sum())


def _pass_flops(paths: torch.Tensor, recv_rowptr: torch.Tensor, num_edges: int,
                basis: torch.Tensor | None, forms: list[tuple[bool, bool, bool]],
                distinct_h: int, need_weight: bool, need_basis: bool, formed: bool,
                emit: bool = False, added: bool = False) -> int:
    """FLOPs of an edge pass over `forms` (need_attr, need_x, need_out) sharing the weights;
    `distinct_h`: how many per-receiver H the forms build (one per distinct cotangent); `formed`:
    the factored weight's rows are given formed; `emit`: the per-edge weight gradients are
    returned, not contracted; `added`: another pass's are added to them (1 per entry)."""
    factored = basis is not None
    need_basis = need_basis and factored
    need_gw = need_weight or need_basis or emit
    if not (need_gw or any(a or x or o for a, x, o in forms)):
        return 0
    mul, _, _, _, n_terms = _path_sizes(paths)
    receivers = int((recv_rowptr[1:] > recv_rowptr[:-1]).sum())
    per_edge = sum(_form_flops(paths, a, need_gw, x, o) for a, x, o in forms)
    if factored:
        rows = any(a or x or o for a, x, o in forms) and not formed
        per_edge += (rows + need_weight + need_basis) * 2 * basis.numel()
        per_edge += added * basis.shape[1]
    return distinct_h * receivers * int((2 * n_terms * mul).sum()) + num_edges * per_edge


def _edge_flops(x, attr, weight, grad, basis, rows, sender, receiver, recv_rowptr, recv_perm,
                send_rowptr, send_perm, paths, terms, coeffs, dims, need_attr, need_weight,
                need_basis, need_x, need_out, out_val=None) -> int:
    """FLOPs the edge kernel executes (torch.utils.flop_counter): per receiver with edges, the
    cotangent contracted with the CG terms (2 per term and channel) when an edge slot or x is
    asked; per edge and path P_j = sum_a x_a H[a][j] (2 in y_dim channels) when a weight or
    attribute gradient is asked, then y_j P_j into the weight gradient and <P_j, w> into the
    attribute gradient (2 y_dim channels each); for d x, Q_a = sum_j y_j H[a][j] (2 in y_dim
    channels) and w Q_a (2 in channels); for the message, the gather's work per edge; a factored
    weight costs 2 K w_dim per edge for each of: the weight row (attribute, x or message), its
    gradient contracted into dH, the per-edge sum into dB (the row not, when given formed)."""
    need_h = need_weight or (need_basis and basis is not None) or need_attr or need_x
    return _pass_flops(paths, recv_rowptr, sender.numel(), basis,
                       [(need_attr, need_x, need_out)], int(need_h), need_weight, need_basis,
                       rows is not None)


def _edge_forms_flops(xs, edge_attrs, grads, weight, basis, rows, sender, receiver, recv_rowptr,
                      recv_perm, send_rowptr, send_perm, paths, terms, coeffs, dims, slots,
                      need_weight, need_basis, weight_grad_in=None, emit_weight_grad=False,
                      out_val=None) -> int:
    """The edge kernel's FLOPs over several forms: each form's per-edge work, the weight rows
    formed and contracted once (or emitted), and one per-receiver H per distinct cotangent."""
    need_gw = need_weight or (need_basis and basis is not None) or emit_weight_grad
    forms = [(bool(s & 1), bool(s & 2), bool(s & 4)) for s in slots]
    with_h = [g for g, (a, x, _) in zip(grads, forms, strict=True) if need_gw or a or x]
    distinct = len({id(g) for g in with_h})
    return _pass_flops(paths, recv_rowptr, sender.numel(), basis, forms, distinct, need_weight,
                       need_basis, rows is not None, emit_weight_grad, weight_grad_in is not None)


def _setup(ctx, inputs: tuple, num_tensors: int) -> None:
    ctx.save_for_backward(*inputs[:num_tensors])
    ctx.graph = ConvGraph(*inputs[num_tensors:num_tensors + 6])
    paths, terms, coeffs, dims = inputs[num_tensors + 6:num_tensors + 10]
    ctx.desc = ConvDescriptor(paths, terms, coeffs, list(dims), None, None)
    ctx.flags = inputs[num_tensors + 10:]
    ctx.num_inputs = len(inputs)
    ctx.set_materialize_grads(False)  # no E x weights zero tensors for unused outputs


def _reached(ctx, tensors: tuple) -> list[bool]:
    """ctx.needs_input_grad narrowed to the inputs this backward pass reaches: the forces'
    `autograd.grad(energy, positions)` reaches no parameter, so the basis gradient (a sum over
    every edge) is skipped there. Outside the engine (tracing) every flagged input counts."""
    need = list(ctx.needs_input_grad)
    for i, tensor in enumerate(tensors):
        if need[i] and tensor is not None:
            try:
                need[i] = torch._C._will_engine_execute_node(get_gradient_edge(tensor).node)
            except RuntimeError:
                pass
    return need


# A force-trained step's loss backward reaches each factored conv twice with its weight and
# basis slots: through the gather (the message) and through the edge op the forces' backward made
# from it. Each pass contracts its per-edge weight gradients [E, w_dim] with the weights' factors
# (two 64 x w_dim contractions per edge). When the edge node runs first in a backward that builds
# no graph, it leaves its per-edge weight gradients uncontracted on the gather node
# (`_DEFER_ATTR`, per backward call: concurrent ones keep theirs apart), which adds them to its
# own and contracts the sum once.
_PEER_ATTR, _DEFER_ATTR, _RAN_ATTR = "cfm_gather_node", "cfm_deferred", "cfm_ran_in_tasks"
DEFER_WEIGHT_GRADIENTS = True  # False: each pass contracts its own (for A/Bs and tests)


def _link_edge_node(ctx, outputs: tuple) -> None:
    """Records the gather node `ctx` on the edge node that made `outputs` in its backward."""
    node = next((t.grad_fn for t in outputs if t is not None and t.grad_fn is not None), None)
    if node is not None:
        setattr(node, _PEER_ATTR, ctx)


def _deferral_target(ctx, basis: torch.Tensor | None, need: list[bool]):
    """The gather node the edge node `ctx` may leave its weight gradients to (it runs later in
    this backward, which builds no graph), with this backward's id; else None."""
    peer = getattr(ctx, _PEER_ATTR, None)
    if (not DEFER_WEIGHT_GRADIENTS or peer is None or basis is None or torch.is_grad_enabled()
            or not (need[2] or need[4])
            or torch.compiler.is_compiling()):
        return None
    task = torch._C._current_graph_task_id()
    try:
        if task in getattr(peer, _RAN_ATTR, ()) or not torch._C._will_engine_execute_node(peer):
            return None
    except RuntimeError:  # outside the engine
        return None
    return peer, task


def _leave_deferred(peer, task: int, left: torch.Tensor) -> None:
    """Leaves per-edge weight gradients on the gather node `peer` for backward call `task`."""
    if not hasattr(peer, _DEFER_ATTR):
        setattr(peer, _DEFER_ATTR, {})
    pending = getattr(peer, _DEFER_ATTR)
    pending[task] = pending[task] + left if task in pending else left


def _take_deferred(ctx) -> torch.Tensor | None:
    """The per-edge weight gradients edge nodes left on the gather node `ctx` in this backward
    (which it now runs: later edge nodes keep theirs)."""
    if torch.is_grad_enabled():
        return None
    task = torch._C._current_graph_task_id()
    if not hasattr(ctx, _RAN_ATTR):
        setattr(ctx, _RAN_ATTR, set())
    getattr(ctx, _RAN_ATTR).add(task)
    return getattr(ctx, _DEFER_ATTR, {}).pop(task, None)


def _contract_deferred(ctx, deferred: torch.Tensor) -> tuple:
    """The gather node's gradients when only deferred per-edge weight gradients reach it (no
    cotangent of its own): their contractions into the weight and basis slots."""
    src, attr, weight, basis, rows = saved = ctx.saved_tensors
    need = _reached(ctx, saved)
    d = [None] * ctx.num_inputs
    perm = ctx.graph.recv_perm
    if need[2]:
        d[2] = torch.zeros_like(weight).index_copy_(0, perm, dense_mm(deferred, basis.T))
    if need[3]:
        d[3] = dense_mm(weight.index_select(0, perm).T, deferred)
    return tuple(d)


def _gather_backward(ctx, grad):
    none = (None,) * ctx.num_inputs
    deferred = _take_deferred(ctx)
    if grad is None:
        return none if deferred is None else _contract_deferred(ctx, deferred)
    src, attr, weight, basis, rows = saved = ctx.saved_tensors
    (transpose,) = ctx.flags
    need = _reached(ctx, saved)
    d = list(none)
    # With an edge slot asked too, d src comes from the same edge pass (one weight-row
    # formation and one traversal fewer): its sender slot, or for the transposed gather its
    # message; else from the gather in the other direction.
    edge_slots = bool(need[1] or need[2] or need[3])
    if deferred is not None and not (need[2] or need[3]):
        raise RuntimeError("channelwise_conv: deferred weight gradients the gather does not need")
    fuse = bool(need[0] and edge_slots)
    if need[0] and not fuse:
        d[0] = conv_gather(grad, attr, weight, ctx.graph, ctx.desc, not transpose, basis)
    if edge_slots:
        x, g = (grad, src) if transpose else (src, grad)
        need_x, need_out = fuse and not transpose, fuse and transpose
        if deferred is None:
            slots = conv_edge(x, attr, weight, g, ctx.graph, ctx.desc, need[1], need[2], basis,
                              need[3], need_x=need_x, need_out=need_out, rows=rows)
        else:
            slots = conv_edge_forms([(x, attr, g, need[1], need_x, need_out)], weight, ctx.graph,
                                    ctx.desc, need[2], basis, need[3], rows, deferred)
        if basis is not None and torch.is_grad_enabled():
            _link_edge_node(ctx, slots)
        gy, gw, gb, gx, out = slots
        d[1], d[2] = (gy if need[1] else None), (gw if need[2] else None)
        d[3] = gb if need[3] else None  # never asked for a None basis
        if fuse:
            d[0] = out if transpose else gx
    return tuple(d)


_EDGE_SLOT = {"x": 0, "attr": 1, "weight": 2, "out": 3, "basis": 4}  # edge op input per slot


def _edge_backward(ctx, a_attr, a_weight, a_basis, a_x, a_out):
    """The edge op's outputs contracted with cotangents are conv forms <g', F(x', attr', W')>,
    each with one slot of <g, F(x, attr, W)> replaced: F(x=a_x), F(attr=a_attr), F(W=a_W) and,
    for the message output, g = a_out; a_W = a_weight (stored weights) or a_weight @ basis +
    weight @ a_basis (factored, itself factored: [a_weight | weight] @ [basis; a_basis]). Each
    form is one edge pass, which gives every slot of it that holds an input of the op (the
    gather's slots x and g from the weight rows the pass forms anyway)."""
    x, attr, weight, g, basis, rows = saved = ctx.saved_tensors
    asked = (a_attr, a_weight, a_basis, a_x, a_out)
    a_attr, a_weight, a_basis, a_x, a_out = (a if flag else None
                                             for a, flag in zip(asked, ctx.flags, strict=True))
    if basis is None:
        a_basis = None
    need = _reached(ctx, saved)
    d = [None] * ctx.num_inputs
    k = weight.shape[1]
    # (x, attr, weight, basis, grad, formed rows) of each form, its slots that hold inputs of the
    # op, and whether it is F(W=a_W) (whose rows are not the op's)
    forms = []
    if a_x is not None:
        forms.append(((a_x, attr, weight, basis, g, rows), ("attr", "weight", "basis", "out"),
                      False))
    if a_attr is not None:
        forms.append(((x, a_attr, weight, basis, g, rows), ("x", "weight", "basis", "out"),
                      False))
    if a_out is not None:
        forms.append(((x, attr, weight, basis, a_out, rows), ("x", "attr", "weight", "basis"),
                      False))
    w_slots = ("x", "attr", "weight", "basis", "out")  # F(W=a_W): its weight slots below
    if basis is None or a_basis is None:
        if a_weight is not None:
            forms.append(((x, attr, a_weight, basis, g, None), w_slots, True))
    elif a_weight is None:
        forms.append(((x, attr, weight, a_basis, g, None), w_slots, True))
    else:
        forms.append(((x, attr, torch.cat([a_weight, weight], 1), torch.cat([basis, a_basis], 0),
                       g, None), w_slots, True))
    target = _deferral_target(ctx, basis, need)
    if target is not None:  # the gather contracts these forms' weight gradients with its own
        forms, left = _merge_shared_weight_forms(forms, need, ctx.graph, ctx.desc, d, emit=True)
        if left is not None:  # (no shared form: nothing left)
            _leave_deferred(*target, left)
    elif not torch.is_grad_enabled():  # nothing differentiates this backward: merge the forms
        forms, _ = _merge_shared_weight_forms(forms, need, ctx.graph, ctx.desc, d)
    for (xf, yf, wf, bf, gf, rf), slots, weight_form in forms:
        ask = {name: need[_EDGE_SLOT[name]] for name in slots}
        if weight_form:
            # a_W stored: no weight slot; factored: its weight slot gives d weight through
            # a_basis and its basis slot d basis through a_weight (halves of the concatenated
            # form's slots)
            ask["weight"] = ask["weight"] and a_basis is not None
            ask["basis"] = ask["basis"] and a_weight is not None and bf is not None
        if not any(ask.values()):
            continue
        gy, gw, gb, gx, out = conv_edge(xf, yf, wf, gf, ctx.graph, ctx.desc, ask.get("attr", False),
                                        ask.get("weight", False), bf, ask.get("basis", False),
                                        ask.get("x", False), ask.get("out", False), rf)
        if weight_form and a_weight is not None and a_basis is not None:
            gw, gb = gw[:, k:], gb[:k]
        got = {"attr": gy, "weight": gw, "basis": gb, "x": gx, "out": out}
        for name in slots:
            if ask[name]:
                d[_EDGE_SLOT[name]] = _add(d[_EDGE_SLOT[name]], got[name])
    return tuple(d)


def _merge_shared_weight_forms(forms: list, need: list[bool], graph: ConvGraph,
                               desc: ConvDescriptor, d: list, emit: bool = False
                               ) -> tuple[list, torch.Tensor | None]:
    """Runs the forms that keep the op's own weights (all but F(W=a_W)) as one edge pass, which
    forms each weight row once and contracts the summed weight gradient once, adding its slots
    into `d`; returns the forms left to run one by one, and with `emit` the summed per-edge
    weight gradients, uncontracted (receiver-CSR order; the weight and basis slots left to the
    caller). Without `emit`, two forms or more only."""
    shared = [f for f in forms if not f[2]]
    if len(shared) < (1 if emit else 2):
        return forms, None
    _, _, weight, basis, _, rows = shared[0][0]
    parts = []
    for (xf, yf, _, _, gf, _), slots, _ in shared:
        parts.append((xf, yf, gf, "attr" in slots and need[_EDGE_SLOT["attr"]],
                      "x" in slots and need[_EDGE_SLOT["x"]],
                      "out" in slots and need[_EDGE_SLOT["out"]]))
    # every shared form has the weight and basis slots
    need_w = need[_EDGE_SLOT["weight"]] and not emit
    need_b = basis is not None and need[_EDGE_SLOT["basis"]] and not emit
    gy, gw, gb, gx, out = conv_edge_forms(parts, weight, graph, desc, need_w, basis, need_b, rows,
                                          emit_weight_grad=emit)
    got = {"attr": gy, "weight": gw, "basis": gb, "x": gx, "out": out}
    asked = {"attr": any(p[3] for p in parts), "weight": need_w, "basis": need_b,
             "x": any(p[4] for p in parts), "out": any(p[5] for p in parts)}
    for name, flag in asked.items():
        if flag:
            d[_EDGE_SLOT[name]] = _add(d[_EDGE_SLOT[name]], got[name])
    return [f for f in forms if f[2]], (gw if emit else None)


def _add(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return b if a is None else a if b is None else a + b


def _no_forms_backward(ctx, *grads):
    raise RuntimeError("channelwise_conv_edge_forms is not differentiable: differentiate "
                       "conv_edge per form (the edge op's backward does so when it builds a graph)")


def _register() -> None:
    """Fake kernels, FLOP formulas and autograd formulas of the loaded ops."""
    for op, fake, flops in (("channelwise_conv_gather", _gather_fake, _gather_flops),
                            ("channelwise_conv_edge", _edge_fake, _edge_flops),
                            ("channelwise_conv_edge_forms", _edge_forms_fake, _edge_forms_flops)):
        torch.library.register_fake(f"cfmtrain::{op}")(fake)
        register_flop_formula(getattr(_OPS, op), get_raw=True)(flops)
    torch.library.register_autograd(
        "cfmtrain::channelwise_conv_gather", _gather_backward,
        setup_context=lambda ctx, inputs, output: _setup(ctx, inputs, 5))
    torch.library.register_autograd(
        "cfmtrain::channelwise_conv_edge", _edge_backward,
        setup_context=lambda ctx, inputs, output: _setup(ctx, inputs, 6))
    torch.library.register_autograd("cfmtrain::channelwise_conv_edge_forms",
                                    _no_forms_backward)


if ops_built(_OPS):
    _register()


class FusedChannelwiseConv(Adopting):
    """Drop-in `conv_tp` for a block with `conv_fusion`: (x, Y, W, edge_index) -> node messages.

    It adopts the e3nn TensorProduct's parameters, buffers and submodules under the same names, so
    the block's state_dict is unchanged, and `restore()` gives the TensorProduct back.
    """

    def __init__(self, tp: o3.TensorProduct) -> None:
        descriptor = conv_descriptor(tp)
        super().__init__(tp)
        self.descriptor = descriptor
        self.irreps_in1, self.irreps_in2 = tp.irreps_in1, tp.irreps_in2
        self.irreps_out, self.weight_numel = tp.irreps_out, tp.weight_numel
        self.__dict__["_radial"] = None  # the block's factored radial MLP (not a submodule)
        self.__dict__["_linear"] = None  # the block's FusedLinear taking ir_mul (not a submodule)

    def factor_weights(self, radial: FoldedRadialMLP | None) -> None:
        """Take `tp_weights` as the last hidden layer of `radial` (which then returns it) and
        form the weights with its last layer inside the kernels; None: whole weights again."""
        if self._radial is not None:
            self._radial.factored = False
        if radial is not None:
            radial.factor()
        self.__dict__["_radial"] = radial

    def hand_ir_mul_to(self, linear: torch.nn.Module | None) -> None:
        """Give the message to `linear` (the block's FusedLinear, which then takes it) in the
        kernels' ir_mul layout, without the permutation to e3nn's mul_ir; None: mul_ir again.
        Only for a block whose forward passes the message to that linear and nowhere else
        (kernels.linear.hand_messages_over checks the block)."""
        if self._linear is not None:
            self._linear.ir_mul_input = False
        if linear is not None:
            if linear.irreps_in != self.irreps_out:
                raise ValueError(f"hand_ir_mul_to: the linear takes {linear.irreps_in}, the conv "
                                 f"gives {self.irreps_out}")
            linear.ir_mul_input = True
        self.__dict__["_linear"] = linear

    def forward(self, node_feats: torch.Tensor, edge_attrs: torch.Tensor,
                tp_weights: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        graph = conv_graph(edge_index, node_feats.shape[0])
        radial = self._radial
        basis = radial.basis() if radial is not None and radial.factored else None
        # A force-trained step reads the weight rows in four or five passes: kept (training
        # mode, weights being trained), they are formed once (1.06-1.08x per step). Inference
        # and MD (eval mode, or frozen weights as in MACECalculator) read them twice, and
        # forming them into memory costs what it saves (0.96-0.98x).
        keep_rows = self.training and basis is not None and basis.requires_grad
        return channelwise_conv(node_feats, edge_attrs, tp_weights, graph, self.descriptor, basis,
                                ir_mul_out=self._linear is not None, keep_rows=keep_rows)

    def __reduce__(self) -> tuple:
        """Pickle as the e3nn TensorProduct (saved by e3nn's own logic, compiled code included)
        and fuse it again on load: the fused module itself holds e3nn's compiled submodules
        without their save logic. The factored radial MLP is pickled once (the
        block holds it too) and linked again."""
        return _fused_conv, (self.restore(), self.training, self._radial, self._linear)


def _fused_conv(tp: o3.TensorProduct, training: bool, radial: FoldedRadialMLP | None = None,
                linear: torch.nn.Module | None = None) -> FusedChannelwiseConv:
    """Unpickles a FusedChannelwiseConv (see its `__reduce__`)."""
    conv = FusedChannelwiseConv(tp)
    conv.training = training
    if radial is not None and radial.factored:
        conv.factor_weights(radial)
    if linear is not None:
        conv.hand_ir_mul_to(linear)
    return conv


def _interaction_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    # imported here: importing mace sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 for the process
    from mace.modules.blocks import InteractionBlock

    return [m for m in model.modules() if isinstance(m, InteractionBlock) and hasattr(m, "conv_tp")]


def fuse_convs(model: torch.nn.Module) -> torch.nn.Module:
    """Swap FusedChannelwiseConv into every interaction block of a mace-torch model, in place."""
    for block in _interaction_blocks(model):
        if isinstance(block.conv_tp, FusedChannelwiseConv):
            continue
        if not isinstance(block.conv_tp, o3.TensorProduct) or hasattr(block, "conv_fusion"):
            raise TypeError(f"fuse_convs: {type(block).__name__}.conv_tp is "
                            f"{type(block.conv_tp).__name__} (conv_fusion="
                            f"{getattr(block, 'conv_fusion', None)!r}); only mace-torch's e3nn "
                            "path (no cueq/oeq config) can be fused")
        block.conv_tp = FusedChannelwiseConv(block.conv_tp)
        block.conv_fusion = FUSION_TAG
    return model


def factor_radial_weights(model: torch.nn.Module) -> int:
    """Fuse each block's radial MLP's last layer into its fused conv (the per-edge weights are
    then formed inside the kernels, chunk by chunk, never stored whole), where the conv is fused
    and the MLP folded with a linear last layer; returns how many blocks are factored."""
    factored = 0
    for block in _interaction_blocks(model):
        conv, radial = block.conv_tp, getattr(block, "conv_tp_weights", None)
        if (isinstance(conv, FusedChannelwiseConv) and isinstance(radial, FoldedRadialMLP)
                and radial.can_factor):
            conv.factor_weights(radial)
            factored += 1
    return factored


def unfuse_convs(model: torch.nn.Module) -> torch.nn.Module:
    """Put the original e3nn TensorProducts back (the inverse of `fuse_convs`), in place."""
    for block in _interaction_blocks(model):
        if isinstance(block.conv_tp, FusedChannelwiseConv):
            block.conv_tp.factor_weights(None)
            block.conv_tp.hand_ir_mul_to(None)
            block.conv_tp = block.conv_tp.restore()
            if getattr(block, "conv_fusion", None) == FUSION_TAG:
                del block.conv_fusion
    return model
