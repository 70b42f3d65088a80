"""FLOP counts of the fused ops (`cfmtrain.bench.flops`, formulas registered beside the ops):
each pass's count against one derived independently, from e3nn's instructions and Wigner 3j
symbols for the conv and from the descriptors' Python term lists for the contraction."""

from __future__ import annotations

import pytest
import torch
from e3nn import o3
from e3nn.o3 import TensorProduct
from mace.modules.irreps_tools import tp_out_irreps_with_instructions

from cfmtrain.bench.flops import FlopCount, count_flops
from cfmtrain.kernels.conv import channelwise_conv, conv_descriptor, conv_graph

EDGES = torch.tensor([[0, 1, 2, 3, 0, 2, 1], [1, 0, 0, 2, 3, 3, 3]])
NODES = 5  # node 4 has no edges


@pytest.fixture(scope="module")
def tp() -> TensorProduct:
    """MACE's conv_tp for 3x0e+3x1o features and spherical harmonics up to l = 2 (float64)."""
    irreps_in, sh = o3.Irreps("3x0e+3x1o"), o3.Irreps.spherical_harmonics(2)
    mid, instructions = tp_out_irreps_with_instructions(irreps_in, sh, sh.sort()[0].simplify())
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return TensorProduct(irreps_in, sh, mid, instructions=instructions, shared_weights=False,
                             internal_weights=False)
    finally:
        torch.set_default_dtype(previous)


def paths(tp: TensorProduct) -> list[tuple[int, int, int, int, int]]:
    """Per instruction: channels, dims of x, Y and the output, Wigner 3j non-zeros."""
    rows = []
    for ins in tp.instructions:
        (mul, ir1), (_, ir2), (_, ir3) = (tp.irreps_in1[ins.i_in1], tp.irreps_in2[ins.i_in2],
                                          tp.irreps_out[ins.i_out])
        nonzero = int((o3.wigner_3j(ir1.l, ir2.l, ir3.l).abs() > 1e-12).sum())
        rows.append((mul, ir1.dim, ir2.dim, ir3.dim, nonzero))
    return rows


def inputs(tp: TensorProduct, hidden: int | None = None) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    width = hidden or tp.weight_numel
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in
            ((NODES, tp.irreps_in1.dim), (EDGES.shape[1], tp.irreps_in2.dim),
             (EDGES.shape[1], width))]


def gather_per_edge(tp: TensorProduct, transpose: bool = False) -> int:
    """M = C . y (2 per 3j non-zero), source x weight, M applied (2 in out per channel)."""
    total = 0
    for mul, d_x, _, d_o, nonzero in paths(tp):
        d_in, d_out = (d_o, d_x) if transpose else (d_x, d_o)
        total += 2 * nonzero + d_in * mul + 2 * d_in * d_out * mul
    return total


def edge_count(tp: TensorProduct, need_attr: bool, need_weight: bool, need_x: bool) -> int:
    """H = C . g per receiver (2 per 3j non-zero and channel); per edge P_j = sum_a x_a H[a][j]
    (2 d_x d_y per channel) for y or w, then 2 d_y each for y and w; for x, Q_a = sum_j y_j
    H[a][j] and w Q_a (2 d_x (d_y + 1))."""
    receivers = len(set(EDGES[1].tolist()))
    per_receiver = sum(2 * nonzero * mul for mul, _, _, _, nonzero in paths(tp))
    per_edge = sum((need_attr or need_weight) * 2 * d_x * d_y * mul
                   + 2 * (need_attr + need_weight) * d_y * mul + need_x * 2 * d_x * (d_y + 1) * mul
                   for mul, d_x, d_y, _, _ in paths(tp))
    return receivers * per_receiver + EDGES.shape[1] * per_edge


def test_conv_forward_counts_the_kernel_work_per_edge(tp):
    desc, graph = conv_descriptor(tp), conv_graph(EDGES, NODES)
    x, y, w = inputs(tp)
    edges = EDGES.shape[1]
    assert count_flops(lambda: channelwise_conv(x, y, w, graph, desc)) == \
        edges * gather_per_edge(tp)
    h = inputs(tp, hidden=4)[2]
    basis = torch.randn(4, tp.weight_numel, dtype=torch.float64)
    assert count_flops(lambda: channelwise_conv(x, y, h, graph, desc, basis)) == \
        edges * (gather_per_edge(tp) + 2 * 4 * tp.weight_numel)


@pytest.mark.parametrize("wanted", ["x", "y", "w", "xyw"])
def test_conv_backward_counts_only_the_gradients_asked(tp, wanted):
    """A backward asks the transposed gather for x alone and the edge op for y and w (and x
    with them, in the same pass): each count is the one of the slots computed."""
    desc, graph = conv_descriptor(tp), conv_graph(EDGES, NODES)
    tensors = dict(zip("xyw", inputs(tp), strict=True))
    for name in wanted:
        tensors[name].requires_grad_(True)
    out = channelwise_conv(tensors["x"], tensors["y"], tensors["w"], graph, desc)
    with FlopCount() as counter:
        out.backward(torch.ones_like(out))
    need_attr, need_weight = "y" in wanted, "w" in wanted
    alone = wanted == "x"
    gather = EDGES.shape[1] * gather_per_edge(tp, transpose=True) if alone else 0
    edge = 0 if alone else edge_count(tp, need_attr, need_weight, "x" in wanted)
    assert counter.per_op.get("cfmtrain.channelwise_conv_gather", 0) == gather
    assert counter.per_op.get("cfmtrain.channelwise_conv_edge", 0) == edge
    assert counter.total == gather + edge > 0


def test_factored_edge_counts_each_weight_matmul(tp):
    """Factored weights: the weight row for y and x (formed once for both), dH = gW B^T for H,
    dB = H^T gW for B, each 2 K w_dim per edge on top of the stored-weight count."""
    desc, graph = conv_descriptor(tp), conv_graph(EDGES, NODES)
    x, y, h = (t.requires_grad_(True) for t in inputs(tp, hidden=4))
    basis = torch.randn(4, tp.weight_numel, dtype=torch.float64, requires_grad=True)
    out = channelwise_conv(x, y, h, graph, desc, basis)
    with FlopCount() as counter:
        out.backward(torch.ones_like(out))
    matmul = EDGES.shape[1] * 2 * basis.numel()
    assert counter.per_op["cfmtrain.channelwise_conv_edge"] == \
        edge_count(tp, True, True, True) + 3 * matmul
    assert "cfmtrain.channelwise_conv_gather" not in counter.per_op  # x came from the edge pass


def test_edge_message_counts_the_gather_work(tp):
    """The edge op's message output alone is the gather's work per edge (and, factored, one
    weight-row formation unless the rows are given formed), with no per-receiver contraction of
    the cotangent."""
    from cfmtrain.kernels.conv import conv_edge

    desc, graph = conv_descriptor(tp), conv_graph(EDGES, NODES)
    x, y, w = inputs(tp)
    g = torch.randn(NODES, tp.irreps_out.dim, dtype=torch.float64)
    edges = EDGES.shape[1]
    assert count_flops(lambda: conv_edge(x, y, w, g, graph, desc, False, False,
                                         need_out=True)) == edges * gather_per_edge(tp)
    h = inputs(tp, hidden=4)[2]
    basis = torch.randn(4, tp.weight_numel, dtype=torch.float64)
    assert count_flops(lambda: conv_edge(x, y, h, g, graph, desc, False, False, basis,
                                         need_out=True)) == \
        edges * (gather_per_edge(tp) + 2 * basis.numel())
    rows = (h[graph.recv_perm] @ basis).contiguous()  # given formed: no formation counted
    assert count_flops(lambda: conv_edge(x, y, h, g, graph, desc, False, False, basis,
                                         need_out=True, rows=rows)) == \
        edges * gather_per_edge(tp)


@pytest.mark.parametrize("shared_grad", [True, False], ids=["one-cotangent", "two"])
def test_edge_forms_count_the_shared_work_once(tp, shared_grad):
    """Two forms in one pass: each form's per-edge work, the weight rows formed, contracted into
    dH and summed into dB once, and the per-receiver H once per distinct cotangent."""
    from cfmtrain.kernels.conv import conv_edge_forms

    desc, graph = conv_descriptor(tp), conv_graph(EDGES, NODES)
    x, y, h = inputs(tp, hidden=4)
    basis = torch.randn(4, tp.weight_numel, dtype=torch.float64)
    g = torch.randn(NODES, tp.irreps_out.dim, dtype=torch.float64)
    g2 = g if shared_grad else g + 1
    forms = [(x, y, g, True, False, False), (x + 1, y - 1, g2, False, True, False)]
    receivers = len(set(EDGES[1].tolist()))
    per_receiver = sum(2 * nonzero * mul for mul, _, _, _, nonzero in paths(tp))
    expected = edge_count(tp, True, True, False) + edge_count(tp, False, True, True) \
        - shared_grad * receivers * per_receiver + 3 * EDGES.shape[1] * 2 * basis.numel()
    assert count_flops(lambda: conv_edge_forms(forms, h, graph, desc, True, basis, True)) == \
        expected


def test_contraction_counts_every_derivative_order():
    """The symmetric contraction's forward: (factors + 1) per term, row and channel, from the
    descriptors' own term lists; a double backward runs the backward and double-backward
    kernels, counted too."""
    from cfmtrain.bench.kernels_worker import paper_model
    from cfmtrain.kernels.symmetric_contraction import SymmetricContractionFused

    model = paper_model(torch.float64, reduced_cg=False, size="tiny")
    sc = SymmetricContractionFused(model.products[0].symmetric_contractions)
    desc, channels, nodes = sc.descriptors, 8, 6
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(nodes, channels, desc.num_ell, generator=gen, dtype=torch.float64)
    y = torch.nn.functional.one_hot(torch.tensor([0, 1, 0, 0, 1, 0]), 2).to(torch.float64)

    def per_row(d) -> int:
        return sum(len(factors) + 1 for _, factors, _ in d.terms)

    expected = (2 * per_row(desc.weights) + nodes * per_row(desc.forward)) * channels
    assert count_flops(lambda: sc(x, y)) == expected
    x.requires_grad_(True)
    with FlopCount() as counter:
        out = sc(x, y)
        (gx,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
        gx.pow(2).sum().backward()
    assert counter.per_op["cfmtrain.sparse_polynomial"] == expected
    assert counter.per_op["cfmtrain.sparse_polynomial_backward"] > 0
    assert counter.per_op["cfmtrain.sparse_polynomial_double_backward"] > 0
