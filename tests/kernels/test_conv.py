"""Fused channelwise conv (cfmtrain.kernels.conv) against mace-torch's own e3nn conv_tp followed by
scatter_sum: block messages, derivatives to second order, edge cases, and whole models."""

import copy
import inspect

import mace.modules  # noqa: F401  (import mace before e3nn)
import numpy as np
import pytest
import torch
from e3nn import o3
from helpers import (  # noqa: F401  (small_and_serial: autouse, one thread, no e3nn TorchScript)
    make_tp,
    small_and_serial,
)
from mace.tools.scatter import scatter_sum

from cfmtrain.kernels.conv import (
    FusedChannelwiseConv,
    channelwise_conv,
    conv_descriptor,
    conv_graph,
    fuse_convs,
    unfuse_convs,
)
from cfmtrain.kernels.linear import HAND_OVER_BLOCKS
from cfmtrain.kernels.radial import FoldedRadialMLP
from cfmtrain.kernels.shapes import CONV_SHAPES


def mace_conv(tp, x, y, w, edge_index):
    return scatter_sum(tp(x[edge_index[0]], y, w), edge_index[1], dim=0, dim_size=x.shape[0])


def random_inputs(tp, edge_index, num_nodes, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    num_edges = edge_index.shape[1]
    return [torch.randn(shape, generator=gen, dtype=dtype).requires_grad_() for shape in
            ((num_nodes, tp.irreps_in1.dim), (num_edges, tp.irreps_in2.dim),
             (num_edges, tp.weight_numel))]


def fused(tp, edge_index, num_nodes):
    desc, graph = conv_descriptor(tp), conv_graph(edge_index, num_nodes)
    return lambda x, y, w: channelwise_conv(x, y, w, graph, desc)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / scale if scale > 0 else a.abs().max().item()


def first_and_second_derivatives(f, inputs, seed=1):
    """Output, VJP of a random cotangent (with graph), and the gradient of its squared norm."""
    out = f(*inputs)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    grads = torch.autograd.grad((out * cot).sum(), inputs, create_graph=True)
    second = torch.autograd.grad(sum((g**2).sum() for g in grads), inputs)
    return [out, *grads, *second]


SHAPES = CONV_SHAPES


@pytest.mark.parametrize("hidden,lmax", SHAPES)
def test_message_and_derivatives_match_mace(float64_default, hidden, lmax):
    tp = make_tp(hidden, lmax)
    edge_index = torch.randint(0, 9, (2, 40), generator=torch.Generator().manual_seed(2))
    inputs = random_inputs(tp, edge_index, 9)
    ours = first_and_second_derivatives(fused(tp, edge_index, 9), inputs)
    ref = first_and_second_derivatives(lambda x, y, w: mace_conv(tp, x, y, w, edge_index), inputs)
    for a, b in zip(ours, ref, strict=True):
        assert rel_err(a, b) < 1e-10


def test_gradcheck_and_gradgradcheck(float64_default):
    tp = make_tp("2x0e+2x1o", 2)
    edge_index = torch.tensor([[0, 1, 2, 2, 3, 0, 4], [1, 0, 0, 3, 3, 2, 2]])
    inputs = random_inputs(tp, edge_index, 5)
    f = fused(tp, edge_index, 5)
    assert torch.autograd.gradcheck(f, inputs, fast_mode=True)
    assert torch.autograd.gradgradcheck(f, inputs, fast_mode=True)


def test_float32_error_within_twice_mace(float64_default):
    tp = make_tp("40x0e+40x1o", 3)
    edge_index = torch.randint(0, 30, (2, 400), generator=torch.Generator().manual_seed(3))
    inputs = random_inputs(tp, edge_index, 30)
    exact = first_and_second_derivatives(fused(tp, edge_index, 30), inputs)
    tp32 = copy.deepcopy(tp).float()
    inputs32 = [t.detach().float().requires_grad_() for t in inputs]
    ours = first_and_second_derivatives(fused(tp32, edge_index, 30), inputs32)
    ref = first_and_second_derivatives(lambda x, y, w: mace_conv(tp32, x, y, w, edge_index),
                                       inputs32)
    for a, b, e in zip(ours, ref, exact, strict=True):
        assert rel_err(a.double(), e) <= 2 * rel_err(b.double(), e)


def test_receiver_with_hundreds_of_edges(float64_default):
    tp = make_tp("20x0e+20x1o", 3)  # register blocks of 8 or 16 doubles, then one register
    gen = torch.Generator().manual_seed(4)
    star = torch.stack([torch.randint(1, 20, (600,), generator=gen), torch.zeros(600).long()])
    edge_index = torch.cat([star, torch.randint(0, 20, (2, 50), generator=gen)], dim=1)
    inputs = random_inputs(tp, edge_index, 20)
    torch.set_num_threads(2)  # enough work for the threaded kernels
    try:
        ours = first_and_second_derivatives(fused(tp, edge_index, 20), inputs)
    finally:
        torch.set_num_threads(1)
    ref = first_and_second_derivatives(lambda x, y, w: mace_conv(tp, x, y, w, edge_index), inputs)
    for a, b in zip(ours, ref, strict=True):
        assert rel_err(a, b) < 1e-10


def test_no_edges_gives_zero_messages_and_gradients(float64_default):
    tp = make_tp("4x0e+4x1o", 2)
    edge_index = torch.zeros((2, 0), dtype=torch.int64)
    x, y, w = random_inputs(tp, edge_index, 3)
    out = fused(tp, edge_index, 3)(x, y, w)
    assert out.shape == (3, tp.irreps_out.dim) and not out.any()
    gx, gy, gw = torch.autograd.grad(out.sum(), (x, y, w), allow_unused=True)
    assert not gx.any() and gy.shape == y.shape and gw.shape == w.shape


def test_bad_inputs_raise_naming_the_argument(float64_default):
    tp = make_tp("4x0e+4x1o", 2)
    edge_index = torch.tensor([[0, 1], [1, 0]])
    x, y, w = (t.detach() for t in random_inputs(tp, edge_index, 2))
    f = fused(tp, edge_index, 2)
    with pytest.raises(RuntimeError, match="edge_weight"):
        f(x, y, w[:, :-1])
    with pytest.raises(RuntimeError, match="edge_attr must be Double"):
        f(x, y.float(), w)
    hidden, basis = torch.randn(2, 3), torch.randn(3, tp.weight_numel)
    with pytest.raises(RuntimeError, match="basis must have"):
        channelwise_conv(x, y, hidden, conv_graph(edge_index, 2), conv_descriptor(tp),
                         basis[:, :-1])
    with pytest.raises(RuntimeError, match="edge_weight must have 3 columns"):
        channelwise_conv(x, y, hidden[:, :2], conv_graph(edge_index, 2), conv_descriptor(tp),
                         basis)
    with pytest.raises(ValueError, match="edge_index has node ids outside"):
        conv_graph(torch.tensor([[0, 5], [1, 0]]), 2)
    with pytest.raises(ValueError, match="edge_index must have shape"):
        conv_graph(torch.zeros(3, 4, dtype=torch.int64), 2)


def formed(h: torch.Tensor, basis: torch.Tensor, graph) -> torch.Tensor:
    """The factored weights' rows in receiver-CSR order, formed by hand."""
    return (h.detach()[graph.recv_perm] @ basis.detach()).contiguous()


@pytest.mark.slow
def test_opcheck_schemas_fake_and_autograd_registrations(float64_default):
    tp = make_tp("2x0e+2x1o", 2)
    edge_index = torch.tensor([[0, 1, 2, 2, 3, 0], [1, 0, 0, 3, 3, 2]])
    desc, graph = conv_descriptor(tp), conv_graph(edge_index, 4)
    x, y, w = random_inputs(tp, edge_index, 4)
    g = torch.randn(4, tp.irreps_out.dim).requires_grad_()
    h, h2 = torch.randn(6, 3).requires_grad_(), torch.randn(6, 5).requires_grad_()
    b, b2 = (torch.randn(k, tp.weight_numel).requires_grad_() for k in (3, 5))
    rows = formed(h, b, graph)
    ops = torch.ops.cfmtrain
    for op, args in (
        (ops.channelwise_conv_gather, (x, y, w, None, None, *graph, *desc.args(), False)),
        (ops.channelwise_conv_gather, (g, y, w, None, None, *graph, *desc.args(), True)),
        (ops.channelwise_conv_gather, (x, y, h, b, None, *graph, *desc.args(), False)),
        (ops.channelwise_conv_gather, (x, y, h, b, rows, *graph, *desc.args(), False)),
        (ops.channelwise_conv_gather, (g, y, h2, b2, None, *graph, *desc.args(), True)),
        # need attr, weight, basis, x, out (the message from the edge pass)
        *((ops.channelwise_conv_edge, (x, y, wt, g, basis, r, *graph, *desc.args(), *flags))
          for wt, basis, r, flags in (
              (w, None, None, (True, True, False, False, False)),
              (w, None, None, (False, True, False, False, True)),
              (h, b, None, (True, True, True, False, False)),
              (h, b, rows, (True, True, True, False, False)),
              (h, b, None, (False, False, True, False, True)),
              (w, None, None, (True, True, False, True, False)),
              (h, b, None, (True, False, True, True, True)),
              (h, b, rows, (True, False, True, True, True)),
              (h, b, None, (False, False, False, True, False)),
              (h, b, None, (False, False, False, False, True)))),
    ):
        torch.library.opcheck(op.default, args)


def largest_allocation(fn) -> int:
    """Bytes of the largest single allocation through torch's CPU allocator while `fn()` runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        fn()
    return max((e.nbytes() for e in prof.profiler.kineto_results.events()
                if e.name() == "[memory]"), default=0)


def test_conv_forward_allocates_no_edges_by_features_tensor(float64_default):
    tp = make_tp("16x0e+16x1o", 3)
    num_nodes, num_edges = 40, 4000
    edge_index = torch.randint(0, num_nodes, (2, num_edges),
                               generator=torch.Generator().manual_seed(7))
    x, y, w = (t.detach() for t in random_inputs(tp, edge_index, num_nodes))
    # the smallest edges x features tensor: the senders' features gathered per edge
    limit = num_edges * tp.irreps_in1.dim * x.element_size()
    f = fused(tp, edge_index, num_nodes)
    assert largest_allocation(lambda: f(x, y, w)) < limit
    # the check sees mace-torch's gathered features and per-edge messages
    assert largest_allocation(lambda: mace_conv(tp, x, y, w, edge_index)) >= limit


def test_graph_is_cached_per_edge_index():
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    assert conv_graph(edge_index, 3) is conv_graph(edge_index, 3)
    assert conv_graph(edge_index.clone(), 3) is not conv_graph(edge_index, 3)


# ---- whole models -------------------------------------------------------------------------------

BLOCKS = [
    ("RealAgnosticInteractionBlock", "RealAgnosticResidualInteractionBlock"),
    ("RealAgnosticResidualInteractionBlock", "RealAgnosticResidualInteractionBlock"),
    ("RealAgnosticDensityInteractionBlock", "RealAgnosticDensityResidualInteractionBlock"),
    ("RealAgnosticAttResidualInteractionBlock", "RealAgnosticAttResidualInteractionBlock"),
    ("RealAgnosticResidualNonLinearInteractionBlock",
     "RealAgnosticResidualNonLinearInteractionBlock"),
]


def make_model(first: str, rest: str, hidden: str = "8x0e+8x1o", lmax: int = 2,
               correlation: int = 2, z: tuple[int, ...] = (28, 29), reduced: bool = False):
    classes = mace.modules.interaction_classes
    return mace.modules.ScaleShiftMACE(
        r_max=4.5, num_bessel=8, num_polynomial_cutoff=5, max_ell=lmax,
        interaction_cls_first=classes[first], interaction_cls=classes[rest], num_interactions=2,
        num_elements=len(z), hidden_irreps=o3.Irreps(hidden), MLP_irreps=o3.Irreps("8x0e"),
        atomic_energies=-np.linspace(1.5, 2.0, len(z)), avg_num_neighbors=12.0,
        atomic_numbers=list(z), correlation=correlation, gate=torch.nn.functional.silu,
        radial_MLP=[16, 16], use_reduced_cg=reduced, atomic_inter_scale=1.3,
        atomic_inter_shift=0.1)


def structures(z: tuple[int, ...] = (28, 29)):
    """A rattled periodic cell, a 1-atom periodic cell (self-images only), a free cluster and
    two isolated atoms (no edges); atoms take the elements `z` in turn (NiCu by default)."""
    import ase.build
    from ase import Atoms

    bulk = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True)
    bulk.rattle(0.1, seed=1)
    one = ase.build.bulk("Ni", "fcc", a=3.5)
    cluster = Atoms("Cu3Ni2", positions=np.random.default_rng(2).uniform(0, 4, (5, 3)))
    isolated = Atoms("CuNi", positions=[[0, 0, 0], [9, 0, 0]])
    every = [bulk, one, cluster, isolated]
    numbers = np.resize(np.asarray(z), sum(len(a) for a in every))
    for a, start in zip(every, np.cumsum([0] + [len(a) for a in every[:-1]]), strict=True):
        a.numbers = numbers[start:start + len(a)]
    return every


def batch_of(atoms_list, r_max=4.5, z=(28, 29)) -> dict:
    from mace import data
    from mace.tools import torch_geometric, utils

    z_table = utils.AtomicNumberTable(list(z))
    graphs = [data.AtomicData.from_config(data.config_from_atoms(a), z_table=z_table,
                                          cutoff=r_max) for a in atoms_list]
    loader = torch_geometric.dataloader.DataLoader(graphs, batch_size=len(graphs), shuffle=False)
    return next(iter(loader)).to_dict()


def model_outputs(model, batch) -> list[torch.Tensor]:
    """Energy, forces, stress and the parameter gradients of an energy+forces loss."""
    batch = {k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()}
    out = model(batch, training=True, compute_force=True, compute_stress=True)
    gen = torch.Generator().manual_seed(5)
    e_ref = torch.randn(out["energy"].shape, generator=gen, dtype=out["energy"].dtype)
    f_ref = torch.randn(out["forces"].shape, generator=gen, dtype=out["forces"].dtype)
    loss = ((out["energy"] - e_ref) ** 2).mean() + ((out["forces"] - f_ref) ** 2).mean()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]
    return [out["energy"].detach(), out["forces"].detach(), out["stress"].detach(), *grads]


@pytest.mark.slow
@pytest.mark.parametrize("first,rest", BLOCKS)
def test_model_matches_mace_float64(float64_default, first, rest):
    torch.manual_seed(0)
    model = make_model(first, rest)
    batch = batch_of(structures())
    ref = model_outputs(model, batch)
    fused_model = fuse_convs(copy.deepcopy(model))
    assert all(isinstance(b.conv_tp, FusedChannelwiseConv) for b in fused_model.interactions)
    ours = model_outputs(fused_model, batch)
    for a, b in zip(ours, ref, strict=True):
        assert rel_err(a, b) < 1e-10


# Pairwise (not full-product) cover of fully fused whole models: every pair of levels of
# (interaction blocks, lmax, correlation, elements, hidden 2e, reduced CG basis) occurs in some row
# (2e hidden features need lmax >= 2).
MATRIX = [
    (0, 1, 1, 1, False, True), (0, 2, 2, 10, True, False), (0, 3, 3, 3, False, True),
    (1, 1, 2, 10, False, True), (1, 2, 1, 3, True, True), (1, 3, 3, 1, True, False),
    (2, 1, 1, 10, False, False), (2, 2, 3, 1, True, True), (2, 3, 2, 3, True, True),
    (3, 1, 1, 3, False, False), (3, 2, 2, 1, False, False), (3, 3, 3, 10, True, True),
    (4, 1, 3, 1, False, True), (4, 2, 2, 10, True, False), (4, 3, 1, 3, True, False),
]
ELEMENTS = {1: (29,), 3: (8, 28, 29), 10: (1, 6, 7, 8, 13, 14, 26, 28, 29, 30)}


@pytest.mark.slow
@pytest.mark.parametrize("case", MATRIX, ids=lambda c: "b{}-l{}-nu{}-z{}-2e{:d}-red{:d}".format(*c))
def test_fully_fused_model_matrix_float64(float64_default, case):
    from cfmtrain.kernels import fuse_model, kernel_backend
    from cfmtrain.kernels.symmetric_contraction import SymmetricContractionFused

    blocks, lmax, correlation, num_z, with_2e, reduced = case
    channels = 4 if with_2e else 3
    hidden = "+".join(f"{channels}x{ir}" for ir in ("0e", "1o", "2e")[:2 + with_2e])
    z = ELEMENTS[num_z]
    torch.manual_seed(0)
    model = make_model(*BLOCKS[blocks], hidden, lmax, correlation, z, reduced)
    batch = batch_of(structures(z), z=z)
    assert sorted(set(batch["node_attrs"].argmax(1).tolist())) == list(range(num_z))
    ref = model_outputs(model, batch)
    fused_model = fuse_model(model)  # in place: a deepcopy recompiles e3nn's code (~1 s)
    assert kernel_backend(fused_model) == {"symmetric_contraction": "cpu-fused",
                                           "conv": "cpu-fused"}
    assert all(isinstance(b.conv_tp, FusedChannelwiseConv) for b in fused_model.interactions)
    # e3nn radial MLPs are folded and their last layer formed inside the conv (factored)
    assert [b.conv_tp._radial is not None and b.conv_tp._radial.factored
            for b in fused_model.interactions] == [
        isinstance(b.conv_tp_weights, FoldedRadialMLP) for b in fused_model.interactions]
    assert all(isinstance(p.symmetric_contractions, SymmetricContractionFused)
               for p in fused_model.products)
    # the conv hands its ir_mul message to the fused linear where the block passes it nowhere else
    assert [b.conv_tp._linear is not None for b in fused_model.interactions] == [
        type(b).__name__ in HAND_OVER_BLOCKS for b in fused_model.interactions]
    ours = model_outputs(fused_model, batch)
    for a, b in zip(ours, ref, strict=True):
        assert rel_err(a, b) < 1e-10


def test_fused_model_forward_allocates_no_edges_by_features_tensor(float64_default):
    """Energy-only forward of a fully fused model in eval mode (inference, MD): nothing per edge
    as wide as the conv's weights is allocated (the radial MLP's last layer is formed inside the
    kernels); the same check sees mace-torch's per-edge messages, the rows a training-mode
    forward keeps for its step and, with the factoring undone, the weights."""
    import ase.build

    from cfmtrain.kernels import fuse_model

    torch.manual_seed(0)
    model = make_model(*BLOCKS[0], hidden="16x0e+16x1o")
    bulk = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True) * (2, 2, 2)
    bulk.numbers[::3] = 28
    bulk.rattle(0.05, seed=1)
    batch = batch_of([bulk])
    num_edges = batch["edge_index"].shape[1]
    assert num_edges >= 30 * len(bulk)
    widest = max(b.conv_tp.weight_numel for b in model.interactions)
    assert widest < min(b.conv_tp.irreps_out.dim for b in model.interactions)
    limit = num_edges * widest * batch["positions"].element_size()

    def forward():
        model(dict(batch), training=False, compute_force=False)

    assert largest_allocation(forward) > limit  # mace-torch: edges x messages
    fuse_model(model).eval()
    assert largest_allocation(forward) < limit
    model.train()
    assert largest_allocation(forward) >= limit  # the rows, kept for a training step
    model.eval()
    for block in model.interactions:
        block.conv_tp.factor_weights(None)
    assert largest_allocation(forward) >= limit  # the weights, stored


def test_model_float32_within_twice_mace(float64_default):
    torch.manual_seed(0)
    model = make_model(*BLOCKS[0], hidden="16x0e+16x1o", lmax=3)
    batch64 = batch_of(structures())
    exact = model_outputs(model, batch64)
    batch32 = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
               for k, v in batch64.items()}
    ref_model = copy.deepcopy(model).float()
    ref = model_outputs(ref_model, batch32)
    ours = model_outputs(fuse_convs(copy.deepcopy(model).float()), batch32)
    for a, b, e in zip(ours, ref, exact, strict=True):
        assert rel_err(a.double(), e) <= 2 * rel_err(b.double(), e) + 1e-6 * (not e.any())


def test_model_batch_without_edges(float64_default):
    from ase import Atoms

    torch.manual_seed(0)
    model = make_model(*BLOCKS[0])
    batch = batch_of([Atoms("Cu", positions=[[0, 0, 0]]), Atoms("Ni", positions=[[0, 0, 0]])])
    assert batch["edge_index"].shape[1] == 0
    ref = model_outputs(model, batch)
    ours = model_outputs(fuse_convs(copy.deepcopy(model)), batch)
    for a, b in zip(ours, ref, strict=True):
        assert rel_err(a, b) < 1e-10


def test_fuse_keeps_state_dict_and_unfuse_restores_mace(float64_default):
    torch.manual_seed(0)
    model = make_model(*BLOCKS[0])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fuse_convs(model)
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], v) for k, v in before.items())
    model.float()
    unfuse_convs(model)
    assert all(type(b.conv_tp) is o3.TensorProduct and not hasattr(b, "conv_fusion")
               for b in model.interactions)
    restored = model.state_dict()
    assert list(restored) == list(before)
    assert all(v.dtype == torch.float32 for v in restored.values() if v.is_floating_point())


@pytest.mark.parametrize("factored", [False, True], ids=["stored", "factored"])
@pytest.mark.parametrize("transpose", [False, True])
def test_ops_gradcheck_to_third_order(float64_default, transpose, factored):
    """Each op alone (the gather either way, the edge op with every output), so that the
    derivatives used only in double backward are themselves checked to second order; factored:
    the weights are hidden @ basis."""
    from cfmtrain.kernels.conv import conv_edge, conv_gather

    tp = make_tp("2x0e+2x1o", 2)
    edge_index = torch.tensor([[0, 1, 2, 2, 3, 0], [1, 0, 0, 3, 3, 2]])
    desc, graph = conv_descriptor(tp), conv_graph(edge_index, 4)
    gen = torch.Generator().manual_seed(6)
    src_dim = tp.irreps_out.dim if transpose else tp.irreps_in1.dim
    src, g = (torch.randn(4, d, generator=gen).requires_grad_()
              for d in (src_dim, tp.irreps_out.dim))
    x = torch.randn(4, tp.irreps_in1.dim, generator=gen).requires_grad_()
    y = torch.randn(6, 9, generator=gen).requires_grad_()
    width = 3 if factored else tp.weight_numel
    w = torch.randn(6, width, generator=gen).requires_grad_()
    b = torch.randn(width, tp.weight_numel, generator=gen).requires_grad_()

    def gather(src, y, w, b):
        return conv_gather(src, y, w, graph, desc, transpose, b if factored else None)

    def edge(x, y, w, g, b):  # every output: the transposed gather and the message included
        return conv_edge(x, y, w, g, graph, desc, basis=b if factored else None,
                         need_basis=True, need_x=True, need_out=True)

    for f, inputs in ((gather, (src, y, w, b)), (edge, (x, y, w, g, b))):
        assert torch.autograd.gradcheck(f, inputs, fast_mode=True)
        assert torch.autograd.gradgradcheck(f, inputs, fast_mode=True)


@pytest.mark.parametrize("threads", [1, 2])
def test_factored_weights_equal_stored_product(float64_default, threads):
    """hidden @ basis formed inside the kernels (per chunk of edges, in threads) gives the conv
    with the stored product: the message, first and second derivatives of every input."""
    from cfmtrain.kernels.conv import channelwise_conv

    torch.set_num_threads(threads)
    tp = make_tp("16x0e+16x1o", 3)
    gen = torch.Generator().manual_seed(8)
    num_nodes, num_edges = 50, 3000  # above the kernels' threading threshold; chunks of 64
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=gen)
    desc, graph = conv_descriptor(tp), conv_graph(edge_index, num_nodes)
    x, y, _ = random_inputs(tp, edge_index, num_nodes)
    h = torch.randn(num_edges, 8, generator=gen).requires_grad_()
    b = torch.randn(8, tp.weight_numel, generator=gen).requires_grad_()
    inputs = (x, y, h, b)
    ours = first_and_second_derivatives(
        lambda x, y, h, b: channelwise_conv(x, y, h, graph, desc, basis=b), inputs)
    stored = first_and_second_derivatives(
        lambda x, y, h, b: channelwise_conv(x, y, h @ b, graph, desc), inputs)
    ref = first_and_second_derivatives(
        lambda x, y, h, b: mace_conv(tp, x, y, h @ b, edge_index), inputs)
    for a, c, r in zip(ours, stored, ref, strict=True):
        assert rel_err(a, c) < 1e-12
        assert rel_err(a, r) < 1e-10


def edge_pass_problem(threads: int, seed: int):
    """(tp, generator, descriptor, graph) of a threaded edge pass: 3000 random edges among 60
    nodes, of which the last 5 receive none."""
    torch.set_num_threads(threads)
    tp = make_tp("16x0e+16x1o", 3)
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, 55, (2, 3000), generator=gen)
    return tp, gen, conv_descriptor(tp), conv_graph(edge_index, 60)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("factored", [False, True], ids=["stored", "factored"])
def test_edge_pass_message_equals_gather(float64_default, threads, factored):
    """The edge op's message output (the gather of x, from the weight rows of its own pass) is
    the gather's, alone or beside the other slots, with nodes that receive no edge."""
    from cfmtrain.kernels.conv import conv_edge, conv_gather

    tp, gen, desc, graph = edge_pass_problem(threads, 9)
    num_nodes, num_edges = 60, 3000
    edge_index = torch.stack([graph.sender, graph.receiver])
    x, y, w = (t.detach() for t in random_inputs(tp, edge_index, num_nodes))
    basis = torch.randn(8, tp.weight_numel, generator=gen) if factored else None
    if factored:
        w = torch.randn(num_edges, 8, generator=gen)
    g = torch.randn(num_nodes, tp.irreps_out.dim, generator=gen)
    ref = conv_gather(x, y, w, graph, desc, False, basis=basis)
    assert ref[-5:].abs().sum() == 0 and ref[:-5].abs().min() > 0
    for others in (False, True):
        gy, gw, gb, gx, out = conv_edge(x, y, w, g, graph, desc, others, others, basis,
                                        others and factored, others, True)
        assert rel_err(out, ref) < 1e-13
        if others:
            alone = conv_edge(x, y, w, g, graph, desc, True, True, basis, factored, True)
            for a, b in zip((gy, gw, gb, gx), alone, strict=False):  # (threads' sums: order)
                assert a.shape == b.shape and (a.numel() == 0 or rel_err(a, b) < 1e-13)


FORMS = [(True, False, True), (False, True, True), (True, True, False), (False, False, True)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("factored", [False, True], ids=["stored", "factored"])
def test_edge_forms_equal_the_sum_of_single_passes(float64_default, threads, factored):
    """One edge pass over several forms sharing the weights (two with the same cotangent, as in
    the double backward) gives, slot by slot, the sum of one `conv_edge` pass per form, with
    nodes that receive no edge; one form alone is `conv_edge`."""
    from cfmtrain.kernels.conv import conv_edge, conv_edge_forms

    tp, gen, desc, graph = edge_pass_problem(threads, 10)
    num_nodes, num_edges = 60, 3000

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    w, basis = (rand(num_edges, 8), rand(8, tp.weight_numel)) if factored else \
        (rand(num_edges, tp.weight_numel), None)
    g = rand(num_nodes, tp.irreps_out.dim)
    xs = [rand(num_nodes, tp.irreps_in1.dim) for _ in FORMS]
    ys = [rand(num_edges, tp.irreps_in2.dim) for _ in FORMS]
    grads = [g, g, rand(num_nodes, tp.irreps_out.dim), g]
    forms = [(x, y, gr, *slots) for x, y, gr, slots in zip(xs, ys, grads, FORMS, strict=True)]
    for subset in (forms, forms[:2], forms[2:3]):
        got = conv_edge_forms(subset, w, graph, desc, True, basis, factored)
        expected = [None] * 5
        for x, y, gr, attr, need_x, out in subset:
            single = conv_edge(x, y, w, gr, graph, desc, attr, True, basis, factored, need_x, out)
            expected = [e if s.numel() == 0 else s if e is None else e + s
                        for e, s in zip(expected, single, strict=True)]
        for a, b in zip(got, expected, strict=True):
            if b is None or b.numel() == 0:
                assert a.numel() == 0
            else:
                assert a.shape == b.shape and rel_err(a, b) < 1e-12
        assert got[4].numel() == 0 or got[4][-5:].abs().sum() == 0


def test_edge_forms_checks_and_is_not_differentiable(float64_default):
    from cfmtrain.kernels.conv import conv_edge_forms

    tp = make_tp("2x0e+2x1o", 2)
    edge_index = torch.tensor([[0, 1, 2, 2, 3, 0], [1, 0, 0, 3, 3, 2]])
    desc, graph = conv_descriptor(tp), conv_graph(edge_index, 4)
    x, y, w = (t.detach() for t in random_inputs(tp, edge_index, 4))
    g = torch.randn(4, tp.irreps_out.dim)
    ops = torch.ops.cfmtrain
    torch.library.opcheck(ops.channelwise_conv_edge_forms.default,
                          ([x, x + 1], [y, y * 2], [g, g], w, None, None, *graph,
                           *desc.args(), [5, 6], True, False))
    with pytest.raises(RuntimeError, match=r"grads\[1\] must have 4 rows"):
        conv_edge_forms([(x, y, g, True, False, False), (x, y, g[:3], False, True, False)], w,
                        graph, desc, True)
    with pytest.raises(RuntimeError, match="one entry per form"):
        ops.channelwise_conv_edge_forms([x], [y], [g], w, None, None, *graph, *desc.args(),
                                        [1, 2], True, False)
    with pytest.raises(RuntimeError, match=r"slots\[0\] = 9"):
        ops.channelwise_conv_edge_forms([x], [y], [g], w, None, None, *graph, *desc.args(),
                                        [9], True, False)
    out = conv_edge_forms([(x, y.requires_grad_(), g, True, False, False)], w, graph, desc, True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        out[0].sum().backward()


def test_double_backward_merges_the_forms_sharing_weights(float64_default, monkeypatch):
    """A force-trained loss's backward (no graph built) runs the double backward's forms that
    share the conv's weights as one edge pass, and its gradients stay mace-torch's; a backward
    that builds a graph runs them one by one (so that they can be differentiated again)."""
    from cfmtrain.kernels import conv, fuse_model

    torch.manual_seed(0)
    model = make_model(*BLOCKS[1])
    batch = batch_of(structures())
    expected = model_outputs(model, batch)
    fuse_model(model)
    merged, real = [], conv.conv_edge_forms

    def recording(forms, *args, **kwargs):
        merged.append(len(forms))
        return real(forms, *args, **kwargs)

    monkeypatch.setattr(conv, "conv_edge_forms", recording)
    monkeypatch.setattr(conv, "DEFER_WEIGHT_GRADIENTS", False)  # (its single-form passes)
    got = model_outputs(model, batch)
    assert merged and min(merged) >= 2
    for a, b in zip(got, expected, strict=True):
        assert rel_err(a, b) < 1e-10
    merged.clear()
    data = {k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()}
    out = model(data, training=True, compute_force=True)
    params = [p for p in model.parameters() if p.requires_grad]
    torch.autograd.grad(out["forces"].pow(2).sum(), params, create_graph=True, allow_unused=True)
    assert not merged


@pytest.mark.slow
def test_benchmark_convs_agree_with_mace():
    """`cfmtrain bench kernels` times the same messages for the fused and mace-torch convs."""
    from cfmtrain.bench.kernels_worker import conv_setup, make_batch, paper_model, supercell

    model = paper_model(torch.float64, reduced_cg=False)
    batch = make_batch(supercell(8), torch.float64)
    fused, inputs = conv_setup(model, batch, "fused")
    mace_convs, _ = conv_setup(model, batch, "mace")  # the same seeded inputs
    for ours, theirs, args in zip(fused, mace_convs, inputs, strict=True):
        got, expected = ours(*args), theirs(*args)
        assert (got - expected).abs().max() <= 1e-10 * expected.abs().max()


def test_forces_pass_skips_the_basis_gradient(float64_default, monkeypatch):
    """autograd.grad(energy, positions) reaches no parameter: the conv's backward does not sum
    the basis gradient over the edges then; asked for the last layer's weight, it does (and
    gives mace-torch's gradient)."""
    from cfmtrain.kernels import conv, fuse_model

    torch.manual_seed(0)
    model = make_model(*BLOCKS[0])
    batch = batch_of(structures())
    last = [list(b.conv_tp_weights.children())[-1].weight for b in model.interactions]

    def energy_grads(m, wrt_last):
        data = {k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()}
        data["positions"].requires_grad_(True)
        energy = m(data, training=True, compute_force=False)["energy"].sum()
        return torch.autograd.grad(energy, [data["positions"], *(last if wrt_last else [])])

    expected = energy_grads(model, True)
    fuse_model(model)
    calls, real = [], conv.conv_edge

    def recording(*args, **kwargs):
        calls.append(inspect.signature(real).bind(*args, **kwargs).arguments.get("need_basis"))
        return real(*args, **kwargs)

    monkeypatch.setattr(conv, "conv_edge", recording)
    energy_grads(model, False)
    assert calls and not any(calls)
    calls.clear()
    got = energy_grads(model, True)
    assert any(calls)
    for a, b in zip(got, expected, strict=True):
        assert rel_err(a, b) < 1e-10


@pytest.mark.parametrize("threads", [1, 2])
def test_formed_rows_give_what_the_kernels_form(float64_default, threads):
    """Factored weights with their rows given formed (`formed_rows`, receiver-CSR order) give
    every op's outputs as when the kernels form the rows themselves: the message, every edge slot
    alone and together, and a multi-form pass; and the ops refuse rows they cannot use."""
    from cfmtrain.kernels.conv import conv_edge, conv_edge_forms, conv_gather, formed_rows

    tp, gen, desc, graph = edge_pass_problem(threads, 11)
    num_nodes, num_edges = 60, 3000
    edge_index = torch.stack([graph.sender, graph.receiver])
    x, y, _ = (t.detach() for t in random_inputs(tp, edge_index, num_nodes))
    h = torch.randn(num_edges, 8, generator=gen)
    basis = torch.randn(8, tp.weight_numel, generator=gen)
    g = torch.randn(num_nodes, tp.irreps_out.dim, generator=gen)
    with torch.enable_grad():
        rows = formed_rows(h, basis, graph)
    assert rows is not None and rel_err(rows, formed(h, basis, graph)) < 1e-14
    message = conv_gather(x, y, h, graph, desc, False, basis)
    assert rel_err(conv_gather(x, y, h, graph, desc, False, basis, rows), message) < 1e-13
    # the kernels read the rows given (the message is linear in them), not rows of their own
    assert rel_err(conv_gather(x, y, h, graph, desc, False, basis, 2 * rows), 2 * message) < 1e-13
    gy = conv_edge(x, y, h, g, graph, desc, True, False, basis, rows=rows)[0]
    assert rel_err(conv_edge(x, y, h, g, graph, desc, True, False, basis, rows=2 * rows)[0],
                   2 * gy) < 1e-13
    for flags in ((True, True, True, True, True), (True, False, False, False, False),
                  (False, False, False, True, False), (False, True, True, False, True)):
        a, w_, b_, x_, o = flags
        got = conv_edge(x, y, h, g, graph, desc, a, w_, basis, b_, x_, o, rows=rows)
        ref = conv_edge(x, y, h, g, graph, desc, a, w_, basis, b_, x_, o)
        for u, v in zip(got, ref, strict=True):
            assert u.shape == v.shape and (v.numel() == 0 or rel_err(u, v) < 1e-13)
    forms = [(x, y, g, True, False, True), (x + 1, y * 2, g - 1, False, True, False)]
    got = conv_edge_forms(forms, h, graph, desc, True, basis, True, rows)
    ref = conv_edge_forms(forms, h, graph, desc, True, basis, True)
    for u, v in zip(got, ref, strict=True):
        assert u.shape == v.shape and (v.numel() == 0 or rel_err(u, v) < 1e-13)
    with pytest.raises(RuntimeError, match="rows must have 3000 rows"):
        conv_gather(x, y, h, graph, desc, False, basis, rows[1:])
    with pytest.raises(RuntimeError, match="formed rows need factored weights"):
        conv_gather(x, y, rows, graph, desc, False, None, rows)
    with pytest.raises(RuntimeError, match="not its transpose"):
        conv_gather(g, y, h, graph, desc, True, basis, rows)


@pytest.mark.slow
def test_training_keeps_the_rows_for_the_step_and_inference_forms_them(float64_default,
                                                                          monkeypatch):
    """A fused model in training mode forms each factored conv's rows once per step, and its
    outputs and force-loss gradients stay mace-torch's; in eval mode (inference), with frozen
    weights (MACECalculator, MD), without grad mode, or above ROW_CACHE_BYTES, the kernels form
    them pass by pass."""
    from cfmtrain.kernels import conv, fuse_model

    made, real = [], conv.formed_rows

    def recording(weight, basis, graph):
        rows = real(weight, basis, graph)
        made.append(rows is not None)
        return rows

    monkeypatch.setattr(conv, "formed_rows", recording)
    torch.manual_seed(0)
    model = make_model(*BLOCKS[1])
    batch = batch_of(structures())
    expected = model_outputs(model, batch)
    fuse_model(model).train()
    got = model_outputs(model, batch)
    assert made and all(made)
    for a, b in zip(got, expected, strict=True):
        assert rel_err(a, b) < 1e-10
    made.clear()
    model.eval()
    model_outputs(model, batch)
    assert made == []  # eval mode: not asked
    model.train()
    for p in model.parameters():
        p.requires_grad_(False)
    out = model({k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()},
                training=False, compute_force=True)
    assert made == [] and out["forces"].abs().sum() > 0  # frozen (MACECalculator): not asked
    for p in model.parameters():
        p.requires_grad_(True)
    model.train()
    with torch.no_grad():
        model({k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()},
              training=True, compute_force=False)
    assert made == []  # no grad mode: nothing is trained
    monkeypatch.setattr(conv, "ROW_CACHE_BYTES", 0)
    model_outputs(model, batch)
    assert made and not any(made)


@pytest.mark.parametrize("threads", [1, 2])
def test_edge_forms_emit_and_take_per_edge_weight_gradients(float64_default, threads):
    """A factored multi-form pass returns its per-edge weight gradients uncontracted (receiver-CSR
    order; those of stored weights W = h @ basis), or adds ones given to its own before
    contracting them into the weight and basis slots; both refuse what they cannot do."""
    from cfmtrain.kernels.conv import conv_edge_forms

    tp, gen, desc, graph = edge_pass_problem(threads, 12)
    num_nodes, num_edges = 60, 3000
    h = torch.randn(num_edges, 8, generator=gen)
    basis = torch.randn(8, tp.weight_numel, generator=gen)
    g = torch.randn(num_nodes, tp.irreps_out.dim, generator=gen)
    x, y = torch.randn(num_nodes, tp.irreps_in1.dim), torch.randn(num_edges, tp.irreps_in2.dim)
    forms = [(x, y, g, True, False, True), (x + 1, y * 2, g - 1, False, True, False)]
    perm = graph.recv_perm
    stored = conv_edge_forms(forms, h @ basis, graph, desc, True)  # per edge, edge order
    emitted = conv_edge_forms(forms, h, graph, desc, False, basis, False, emit_weight_grad=True)
    assert emitted[1].shape == (num_edges, tp.weight_numel) and emitted[2].numel() == 0
    assert rel_err(emitted[1], stored[1][perm]) < 1e-13
    for u, v in zip((emitted[0], *emitted[3:]), (stored[0], *stored[3:]), strict=True):
        assert rel_err(u, v) < 1e-13  # the other slots as usual
    own = conv_edge_forms(forms, h, graph, desc, True, basis, True)
    extra = torch.randn(num_edges, tp.weight_numel, generator=gen)
    got = conv_edge_forms(forms, h, graph, desc, True, basis, True, weight_grad_in=extra)
    d_h = own[1].clone()
    d_h[perm] += extra @ basis.T
    assert rel_err(got[1], d_h) < 1e-13
    assert rel_err(got[2], own[2] + h[perm].T @ extra) < 1e-13
    assert rel_err(got[0], own[0]) < 1e-13 and rel_err(got[4], own[4]) < 1e-13
    ops = torch.ops.cfmtrain
    small_tp = make_tp("2x0e+2x1o", 2)
    edge_index = torch.tensor([[0, 1, 2, 2, 3, 0], [1, 0, 0, 3, 3, 2]])
    sd, sg = conv_descriptor(small_tp), conv_graph(edge_index, 4)
    sx, sy, _ = (t.detach() for t in random_inputs(small_tp, edge_index, 4))
    sh, sb = torch.randn(6, 3), torch.randn(3, small_tp.weight_numel)
    sgr = torch.randn(4, small_tp.irreps_out.dim)
    for need, gw_in, emit in ((False, None, True), (True, torch.randn(6, sb.shape[1]), False)):
        torch.library.opcheck(ops.channelwise_conv_edge_forms.default,
                              ([sx], [sy], [sgr], sh, sb, None, *sg, *sd.args(), [3], need, need,
                               gw_in, emit))
    with pytest.raises(RuntimeError, match="emit_weight_grad needs factored weights and neither"):
        conv_edge_forms(forms, h, graph, desc, True, basis, False, emit_weight_grad=True)
    with pytest.raises(RuntimeError, match="weight_grad_in needs factored weights"):
        conv_edge_forms(forms, h @ basis, graph, desc, True, weight_grad_in=extra)
    with pytest.raises(RuntimeError, match="weight_grad_in must have 3000 rows"):
        conv_edge_forms(forms, h, graph, desc, True, basis, True, weight_grad_in=extra[1:])


def record_deferred_takes(monkeypatch) -> list[bool]:
    """Per edge-forms pass from now on: whether it was given deferred weight gradients."""
    from cfmtrain.kernels import conv

    taken, real = [], conv.conv_edge_forms

    def recording(*args, **kwargs):
        taken.append(kwargs.get("weight_grad_in", args[8] if len(args) > 8 else None) is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(conv, "conv_edge_forms", recording)
    return taken


@pytest.mark.slow
def test_loss_backward_contracts_both_passes_weight_gradients_once(float64_default,
                                                                     monkeypatch):
    """In a force-trained loss's backward, each factored conv's edge node (from the forces'
    backward) leaves its per-edge weight gradients to the gather node, which contracts them with
    its own: one pass per conv takes them, and the gradients stay mace-torch's and those of each
    pass contracting its own. A backward that builds a graph does not defer."""
    from cfmtrain.kernels import conv, fuse_model

    torch.manual_seed(0)
    model = make_model(*BLOCKS[1])
    batch = batch_of(structures())
    expected = model_outputs(model, batch)
    fuse_model(model)
    taken = record_deferred_takes(monkeypatch)
    got = model_outputs(model, batch)
    convs = sum(isinstance(m, conv.FusedChannelwiseConv) for m in model.modules())
    assert convs == 2 and sum(taken) == convs
    monkeypatch.setattr(conv, "DEFER_WEIGHT_GRADIENTS", False)
    taken.clear()
    own = model_outputs(model, batch)
    assert not any(taken)
    for a, b, c in zip(got, own, expected, strict=True):
        assert rel_err(a, c) < 1e-10 and rel_err(a, b) < 1e-12
    monkeypatch.setattr(conv, "DEFER_WEIGHT_GRADIENTS", True)
    # mace-torch's training loop: loss.backward() into .grad, with no inputs named
    data = {k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()}
    out = model(data, training=True, compute_force=True, compute_stress=True)
    gen = torch.Generator().manual_seed(5)
    e_ref = torch.randn(out["energy"].shape, generator=gen, dtype=out["energy"].dtype)
    f_ref = torch.randn(out["forces"].shape, generator=gen, dtype=out["forces"].dtype)
    model.zero_grad(set_to_none=True)
    taken.clear()
    (((out["energy"] - e_ref) ** 2).mean() + ((out["forces"] - f_ref) ** 2).mean()).backward()
    assert sum(taken) == convs
    params = [p for p in model.parameters() if p.requires_grad]
    for p, b in zip(params, own[3:], strict=True):
        assert rel_err(torch.zeros_like(p) if p.grad is None else p.grad, b) < 1e-12
    data = {k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()}
    out = model(data, training=True, compute_force=True)
    taken.clear()
    torch.autograd.grad(out["forces"].pow(2).sum(), params, create_graph=True, allow_unused=True)
    assert not any(taken)


class _NoCotangent(torch.autograd.Function):
    """Identity whose backward gives its input no cotangent (None)."""

    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


def deferral_problem(nonlinear: bool):
    """A factored conv whose attributes depend on `pos`: the message, an energy from it (linear
    or quadratic in the message) and the leaves (pos, h, basis)."""
    from cfmtrain.kernels.conv import conv_gather

    tp = make_tp("4x0e+4x1o", 2)
    gen = torch.Generator().manual_seed(13)
    edge_index = torch.randint(0, 20, (2, 300), generator=gen)
    desc, graph = conv_descriptor(tp), conv_graph(edge_index, 24)
    x = torch.randn(24, tp.irreps_in1.dim, generator=gen)
    y0 = torch.randn(300, tp.irreps_in2.dim, generator=gen)
    pos = torch.randn(300, 1, generator=gen).requires_grad_()
    h = torch.randn(300, 6, generator=gen).requires_grad_()
    basis = torch.randn(6, tp.weight_numel, generator=gen).requires_grad_()
    c = torch.randn(24, tp.irreps_out.dim, generator=gen)
    m = conv_gather(x, y0 * torch.sin(pos), h, graph, desc, False, basis)
    energy = ((m * m if nonlinear else m) * c).sum()
    return m, energy, (pos, h, basis)


@pytest.mark.parametrize("defer", [True, False])
def test_deferred_weight_gradients_reach_a_gather_without_a_cotangent(float64_default,
                                                                       monkeypatch, defer):
    """A gather that gets no cotangent of its own (None) but the weight gradients its edge node
    deferred contracts them alone: the gradients equal those without deferral."""
    from cfmtrain.kernels import conv

    def grads(flag: bool):
        monkeypatch.setattr(conv, "DEFER_WEIGHT_GRADIENTS", flag)
        m, energy, (pos, h, basis) = deferral_problem(nonlinear=False)
        forces = torch.autograd.grad(energy, pos, create_graph=True)[0]
        loss = (forces ** 2).sum() + _NoCotangent.apply(m).sum()
        return torch.autograd.grad(loss, [h, basis])

    alone, real = [], conv._contract_deferred

    def recording(ctx, deferred):
        alone.append(deferred.shape)
        return real(ctx, deferred)

    monkeypatch.setattr(conv, "_contract_deferred", recording)
    got = grads(defer)
    assert len(alone) == int(defer)  # the gather contracted the deferred gradients alone
    ref = grads(False)
    for a, b in zip(got, ref, strict=True):
        assert rel_err(a, b) < 1e-12 and b.abs().sum() > 0


def test_deferral_with_two_force_passes_and_a_retained_graph(float64_default, monkeypatch):
    """Two graph-building force passes give one gather two edge nodes: both defer to it, and a
    second backward over the retained graph defers again; every gradient equals the undeferred
    one (twice over for the second backward, which accumulates)."""
    from cfmtrain.kernels import conv

    taken = record_deferred_takes(monkeypatch)

    def grads(flag: bool):
        monkeypatch.setattr(conv, "DEFER_WEIGHT_GRADIENTS", flag)
        m, energy, (pos, h, basis) = deferral_problem(nonlinear=True)
        f1 = torch.autograd.grad(energy, pos, create_graph=True)[0]
        f2 = torch.autograd.grad(energy, pos, create_graph=True)[0]
        loss = energy + (f1 ** 2).sum() + 0.5 * (f2 ** 3).sum()
        loss.backward(inputs=[h, basis], retain_graph=True)
        once = [h.grad.clone(), basis.grad.clone()]
        loss.backward(inputs=[h, basis])
        return once, [h.grad, basis.grad]

    taken.clear()
    (once, twice) = grads(True)
    assert sum(taken) == 2  # the gather took both edge nodes' gradients, in each backward
    taken.clear()
    ref_once, ref_twice = grads(False)
    assert not any(taken)
    for a, b in zip(once + twice, ref_once + ref_twice, strict=True):
        assert rel_err(a, b) < 1e-12
    for a, b in zip(twice, ref_once, strict=True):
        assert rel_err(a, 2 * b) < 1e-12
