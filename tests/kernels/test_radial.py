"""The folded radial MLP against e3nn's FullyConnectedNet: outputs, first and second derivatives
(what a force-trained step takes), on its own and inside a MACE model; state_dict, unfold and
pickling unchanged."""

from __future__ import annotations

import mace  # noqa: F401  (import mace before e3nn)
import pytest
import torch
from e3nn.nn import FullyConnectedNet
from helpers import assert_swap_exact_and_round_trips, rel_err

from cfmtrain.kernels.radial import FoldedRadialMLP, fold_radial_mlps, unfold_radial_mlps


def second_order(net: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Output, d(sum out^2)/dx and the parameter gradients of |that|^2 (a double backward)."""
    x = x.clone().requires_grad_(True)
    out = net(x)
    (dx,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
    params = list(net.parameters())
    return [out.detach(), dx.detach(), *torch.autograd.grad(dx.pow(2).sum(), params)]


@pytest.mark.parametrize("kwargs", [
    {"hs": [8, 64, 64, 64, 40], "act": torch.nn.functional.silu},  # MACE's radial MLP
    {"hs": [5, 7, 3], "act": torch.tanh, "variance_in": 2.0, "variance_out": 0.5},
    {"hs": [5, 7, 3], "act": torch.nn.functional.silu, "out_act": True, "variance_out": 3.0},
], ids=["mace", "variances", "out-act"])
def test_folded_mlp_equals_e3nn_to_second_order(kwargs):
    torch.manual_seed(0)
    fc = FullyConnectedNet(**kwargs).double()
    x = torch.randn(50, kwargs["hs"][0], dtype=torch.float64)
    expected = second_order(fc, x)
    folded = FoldedRadialMLP(fc)
    assert all(p is q for p, q in zip(folded.parameters(), fc.parameters(), strict=True))
    for got, want in zip(second_order(folded, x), expected, strict=True):
        assert rel_err(got, want) < 1e-13


def test_unsupported_activation_is_refused():
    fc = FullyConnectedNet([3, 4, 2], torch.nn.functional.silu)
    fc.layer0.act = torch.nn.SiLU()  # not normalised: not e3nn's form
    with pytest.raises(TypeError, match="unsupported activation"):
        FoldedRadialMLP(fc)


def test_folded_model_matches_mace_and_round_trips():
    assert_swap_exact_and_round_trips(fold_radial_mlps, unfold_radial_mlps, "conv_tp_weights",
                                      FoldedRadialMLP, 1e-12)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("factored", [False, True], ids=["whole", "factored"])
def test_eval_mode_runs_the_compiled_hidden_layers_as_e3nn(threads, factored, monkeypatch):
    """In eval mode, or with frozen weights, the SiLU hidden layers run as the compiled op over
    chunks of edges (2,500
    rows: full and partial chunks, both threads): outputs, first derivatives (input and weights)
    and second derivatives (a backward that builds a graph) as e3nn's net; factored, the hidden
    layer times the basis is the net's output."""
    from cfmtrain.kernels import radial

    calls = []
    real = radial._FusedHidden.apply
    monkeypatch.setattr(radial._FusedHidden, "apply",
                        lambda *a: calls.append(len(a) - 1) or real(*a))
    torch.manual_seed(0)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fc = FullyConnectedNet([10, 64, 64, 64, 40], torch.nn.functional.silu).double()
        x = torch.randn(2500, 10, dtype=torch.float64)
        expected = second_order(fc, x)
        folded = FoldedRadialMLP(fc, factored=factored).eval()
        if factored:
            net = lambda v: folded(v) @ folded.basis()  # noqa: E731
            net.parameters = folded.parameters
        else:
            net = folded
        for got, want in zip(second_order(net, x), expected, strict=True):
            assert rel_err(got, want) < 1e-12
        assert calls == [3]  # the three hidden layers, in one op
        xg = x.clone().requires_grad_(True)
        out = net(xg)
        params = list(folded.parameters())
        got = torch.autograd.grad((out * out.detach()).sum(), [xg, *params])
        xe = x.clone().requires_grad_(True)
        oe = fc(xe)
        want = torch.autograd.grad((oe * oe.detach()).sum(), [xe, *fc.parameters()])
        for a, b in zip(got, want, strict=True):  # first order: the compiled backward
            assert rel_err(a, b) < 1e-12
        folded.train()
        calls.clear()
        folded(x)
        assert calls == []  # being trained: torch's ops (and the fused second derivative)
        for p in folded.parameters():
            p.requires_grad_(False)
        folded(x)
        assert calls == [3]  # frozen in training mode (as MACECalculator runs a model)
    finally:
        torch.set_num_threads(previous)


def test_compiled_hidden_layers_opcheck_and_errors():
    ops = torch.ops.cfmtrain
    x = torch.randn(300, 6, dtype=torch.float64)
    ws = [torch.randn(6, 8, dtype=torch.float64), torch.randn(8, 5, dtype=torch.float64)]
    g = torch.randn(300, 5, dtype=torch.float64)
    torch.library.opcheck(ops.radial_mlp.default, (x, ws, True))
    out, z = ops.radial_mlp(x, ws, True)
    assert [t.shape for t in z] == [(300, 8), (300, 5)]
    assert rel_err(z[1], torch.nn.functional.silu(z[0]) @ ws[1]) < 1e-14
    assert rel_err(out, torch.nn.functional.silu(z[1])) < 1e-14
    assert ops.radial_mlp(x, ws, False)[1] == []
    torch.library.opcheck(ops.radial_mlp_backward.default, (x, ws, z, g, True, True))
    with pytest.raises(RuntimeError, match=r"weights\[1\] must have 8 rows, got 7"):
        ops.radial_mlp(x, [ws[0], torch.randn(7, 5, dtype=torch.float64)], False)
    with pytest.raises(RuntimeError, match="x must be float32 or float64"):
        ops.radial_mlp(x.to(torch.int64), ws, False)
    with pytest.raises(RuntimeError, match=r"grad must be .* of shape \[300, 5\]"):
        ops.radial_mlp_backward(x, ws, z, g[:, :4].contiguous(), True, False)
    with pytest.raises(RuntimeError, match=r"z\[1\] must be a contiguous \[300, 5\]"):
        ops.radial_mlp_backward(x, ws, [z[0], z[0]], g, True, False)
