"""The fused symmetric contraction against mace-torch's own module: outputs, gradients, double
backward, float32 error bounds, gradcheck, the profile of a fused pass, and edge cases."""

from __future__ import annotations

import mace  # noqa: F401  (import mace before e3nn)
import pytest
import torch
from e3nn import o3
from mace.modules.symmetric_contraction import SymmetricContraction

from cfmtrain.kernels.shapes import SC_SHAPES
from cfmtrain.kernels.sparse_polynomial import Descriptor, evaluate, merged_terms
from cfmtrain.kernels.symmetric_contraction import SymmetricContractionFused

SHAPES = SC_SHAPES


def _irreps(channels: int, irreps: list[str]) -> o3.Irreps:
    return o3.Irreps("+".join(f"{channels}x{ir}" for ir in irreps))


def make_sc(lmax, correlation, out, elements, channels, reduced, dtype=torch.float64):
    """A mace SymmetricContraction built with `dtype` as the default dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        irreps_in = _irreps(channels, [f"{ell}{'eo'[ell % 2]}" for ell in range(lmax + 1)])
        return SymmetricContraction(irreps_in, _irreps(channels, out.split("+")),
                                    correlation=correlation, num_elements=elements,
                                    use_reduced_cg=reduced)
    finally:
        torch.set_default_dtype(previous)


def make_inputs(sc, num_nodes, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    channels = sc.irreps_in[0].mul
    num_ell = sum(mul_ir.ir.dim for mul_ir in sc.irreps_in)
    num_elements = sc.contractions[0].weights_max.shape[0]
    x = torch.randn(num_nodes, channels, num_ell, generator=gen, dtype=dtype)
    elem = torch.randint(0, num_elements, (num_nodes,), generator=gen)
    y = torch.nn.functional.one_hot(elem, num_elements).to(dtype)
    return x, y


def randomize_weights(sc, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in sc.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))


def outputs_and_grads(module, x, y):
    """Output, and gradients of a force-like loss (double backward) w.r.t. x and weights."""
    x = x.clone().requires_grad_(True)
    params = [p for p in module.parameters() if p.requires_grad]
    out = module(x, y)
    energy = (out * torch.linspace(-1, 1, out.shape[1], dtype=out.dtype)).pow(2).sum()
    (gx,) = torch.autograd.grad(energy, x, create_graph=True)
    loss = energy + gx.pow(2).sum()
    grads = torch.autograd.grad(loss, [x, *params])
    return out.detach(), gx.detach(), grads


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def l2_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative L2 error: float32 rounding is compared over whole tensors, not one entry."""
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_matches_mace_float64(shape):
    sc = make_sc(*shape)
    randomize_weights(sc)
    fused = SymmetricContractionFused(sc)
    x, y = make_inputs(sc, num_nodes=7)
    ref = outputs_and_grads(sc, x, y)
    got = outputs_and_grads(fused, x, y)
    assert rel_err(got[0], ref[0]) < 1e-10
    assert rel_err(got[1], ref[1]) < 1e-10
    for g, r in zip(got[2], ref[2], strict=True):
        assert rel_err(g, r) < 1e-10


@pytest.mark.parametrize("shape", [(2, 3, "0e+1o+2e", 10, 12, False), SHAPES[5]],
                         ids=["2e", "l3-reduced"])
def test_float32_error_within_twice_mace(shape):
    """Outputs and double-backward gradients in float32: relative L2 error against float64
    at most twice mace-torch's own float32 error."""
    sc64 = make_sc(*shape)
    randomize_weights(sc64)
    sc32 = make_sc(*shape, dtype=torch.float32)
    sc32.load_state_dict(sc64.state_dict())
    fused32 = SymmetricContractionFused(sc32)
    x, y = make_inputs(sc64, num_nodes=60)
    ref = outputs_and_grads(sc64, x, y)
    mace32 = outputs_and_grads(sc32, x.float(), y.float())
    ours32 = outputs_and_grads(fused32, x.float(), y.float())
    pairs = [(ours32[0], mace32[0], ref[0]), (ours32[1], mace32[1], ref[1])]
    pairs += list(zip(ours32[2], mace32[2], ref[2], strict=True))
    for ours, theirs, exact in pairs:
        assert ours.dtype == torch.float32
        assert l2_err(ours, exact) <= 2 * l2_err(theirs, exact)


def test_gradcheck_and_gradgradcheck():
    sc = make_sc(1, 3, "0e+1o", 2, 2, False)
    randomize_weights(sc)
    fused = SymmetricContractionFused(sc)
    x, y = make_inputs(sc, num_nodes=3)
    names = [n for n, p in fused.named_parameters() if p.requires_grad]
    params = [p.detach().clone().requires_grad_(True) for n, p in fused.named_parameters()
              if p.requires_grad]

    def f(x, *weights):
        return torch.func.functional_call(fused, dict(zip(names, weights, strict=True)), (x, y))

    inputs = (x.requires_grad_(True), *params)
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


def test_fused_pass_has_no_dense_contraction():
    sc = make_sc(2, 3, "0e+1o", 3, 4, False)
    fused = SymmetricContractionFused(sc)
    x, y = make_inputs(sc, num_nodes=10)
    with torch.profiler.profile() as prof:
        outputs_and_grads(fused, x, y)
    names = {e.name for e in prof.events()}
    assert "cfmtrain::sparse_polynomial" in names
    assert "cfmtrain::sparse_polynomial_backward" in names
    assert "cfmtrain::sparse_polynomial_double_backward" in names
    dense = {"aten::einsum", "aten::bmm", "aten::mm", "aten::matmul", "aten::tensordot"}
    assert not names & dense, names & dense


def test_one_atom_matches_mace():
    sc = make_sc(2, 3, "0e+1o", 1, 3, True)
    randomize_weights(sc)
    fused = SymmetricContractionFused(sc)
    x, y = make_inputs(sc, num_nodes=1)
    ref = outputs_and_grads(sc, x, y)
    got = outputs_and_grads(fused, x, y)
    assert got[0].shape == ref[0].shape == (1, 3 * 4)
    for g, r in zip([got[0], got[1], *got[2]], [ref[0], ref[1], *ref[2]], strict=True):
        assert rel_err(g, r) < 1e-10


def test_empty_batch():
    # mace-torch itself cannot reshape an empty output; the fused module returns (0, dim).
    sc = make_sc(2, 3, "0e+1o", 2, 3, False)
    fused = SymmetricContractionFused(sc)
    x, y = make_inputs(sc, num_nodes=0)
    out, gx, grads = outputs_and_grads(fused, x, y)
    assert out.shape == (0, 3 * 4) and gx.shape == x.shape
    assert grads[0].shape == x.shape
    for g, p in zip(grads[1:], [p for p in sc.parameters() if p.requires_grad], strict=True):
        assert g.shape == p.shape and not g.any()


def test_rejects_node_attrs_that_are_not_one_hot():
    sc = make_sc(1, 2, "0e", 2, 2, True)
    fused = SymmetricContractionFused(sc)
    x, y = make_inputs(sc, num_nodes=4)
    with pytest.raises(ValueError, match="one-hot"):
        fused(x, y * 0.5)
    with pytest.raises(ValueError, match="channels"):
        fused(x[:, :, :2], y)


def test_generic_polynomial_brute_force_to_third_order():
    # out0 = 0.5 W0 x1 x2; out1 = -1.5 W1 x0^2 x3 + 2 W2 x3, W chosen per element
    terms = merged_terms([(0, ((1, 0), (0, 1), (0, 2)), 0.5),
                          (1, ((1, 1), (0, 0), (0, 0), (0, 3)), -1.5),
                          (1, ((1, 2), (0, 3)), 2.0)])
    desc = Descriptor([4, 3], [False, True], 2, False, terms)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    elem = torch.tensor([0, 1, 1, 0, 1])
    out = evaluate(desc, [x, w], elem, 5, 2)
    we = w[elem]
    expected = torch.stack([0.5 * we[:, 0] * x[:, 1] * x[:, 2],
                            -1.5 * we[:, 1] * x[:, 0] ** 2 * x[:, 3] + 2 * we[:, 2] * x[:, 3]], 1)
    assert torch.allclose(out, expected, rtol=1e-14, atol=1e-14)

    def second(x, w):
        g = torch.autograd.grad(evaluate(desc, [x, w], elem, 5, 2).pow(2).sum(), [x, w],
                                create_graph=True)
        return g[0].sin().sum() + g[1].pow(2).sum()

    assert torch.autograd.gradcheck(second, (x, w))
    assert torch.autograd.gradgradcheck(second, (x, w))


def test_op_input_checks_name_the_argument():
    desc = Descriptor([2], [False], 1, False, merged_terms([(0, ((0, 0), (0, 1)), 1.0)]))
    x = torch.randn(3, 2, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        evaluate(desc, [x.int()], None, 3)
    with pytest.raises(RuntimeError, match=r"operands\[0\]. must have 5 rows"):
        evaluate(desc, [x], None, 5)
    with pytest.raises(RuntimeError, match=r"operands\[0\]. must be contiguous"):
        evaluate(desc, [x.transpose(0, 2).contiguous().transpose(0, 2)], None, 3)
    per_elem = Descriptor([2], [True], 1, False, merged_terms([(0, ((0, 1),), 1.0)]))
    with pytest.raises(RuntimeError, match="elem"):
        evaluate(per_elem, [x], torch.tensor([0, 1, 3]), 3, 3)
    with pytest.raises(ValueError, match="factor"):
        Descriptor([2], [False], 1, False, {(0, ((0, 2),)): 1.0})


def opcheck_cases():
    """(op, arguments) of the forward, backward and double-backward ops of a descriptor with a
    per-element operand (as the symmetric contraction's weights)."""
    from cfmtrain.kernels import sparse_polynomial as sp

    desc = Descriptor([4, 3], [False, True], 2, False, merged_terms(
        [(0, ((1, 0), (0, 1), (0, 2)), 0.5), (1, ((1, 1), (0, 0), (0, 0), (0, 3)), -1.5),
         (1, ((1, 2), (0, 3)), 2.0)]))
    gen = torch.Generator().manual_seed(0)
    x, gx = (torch.randn(5, 4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
             for _ in range(2))
    w = torch.randn(2, 3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    g = torch.randn(5, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    elem = torch.tensor([0, 1, 1, 0, 1])
    first = desc.derivative(0)  # d/dx: operands (x, w, g), per-node output
    second = first.derivative(1)  # d/dw of it: operands (x, w, g, gx), per-element output
    cases = [(desc, [x, w], sp._FORWARD), (first, [x, w, g], sp._BACKWARD),
             (second, [x, w, g, gx], sp._DOUBLE_BACKWARD)]
    # evaluate() with a recording `op` gives the real op call's arguments
    return [(op.default, evaluate(d, ops, elem, 5, 2, op=lambda *a: a)) for d, ops, op in cases]


def test_opcheck_schemas_fake_and_autograd_registrations():
    for op, args in opcheck_cases():
        torch.library.opcheck(op, args, test_utils=(
            "test_schema", "test_autograd_registration", "test_faketensor"))


def test_opcheck_aot_dispatch_dynamic():
    for op, args in opcheck_cases():
        torch.library.opcheck(op, args, test_utils="test_aot_dispatch_dynamic")


@pytest.mark.slow
def test_torch_compile_full_graph_matches_eager_with_gradients():
    """torch.compile(fullgraph=True, dynamic=True) of the fused module: outputs, input and weight
    gradients equal eager ones, at two node counts (one graph, dynamic shapes), with the
    elements of the second batch a subset of the first's."""
    sc = make_sc(2, 3, "0e+1o+2e", 3, 8, False)
    randomize_weights(sc)
    fused = SymmetricContractionFused(sc)
    compiled = torch.compile(fused, fullgraph=True, dynamic=True)
    for num_nodes, seed in ((7, 0), (11, 3)):
        x, y = make_inputs(sc, num_nodes, seed=seed)
        if seed:
            y = torch.nn.functional.one_hot(y.argmax(-1) % 2, 3).to(y.dtype)
        results = []
        for module in (fused, compiled):
            fused.zero_grad()
            xg = x.clone().requires_grad_()
            out = module(xg, y)
            (out * torch.sin(out.detach())).sum().backward()
            results.append([out.detach(), xg.grad, *[p.grad.clone() for p in fused.parameters()]])
        assert results[0][0].abs().max() > 0.1
        for eager, traced in zip(*results, strict=True):
            torch.testing.assert_close(traced, eager, rtol=1e-12, atol=1e-12)
