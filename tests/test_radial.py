"""The folded radial MLP against e3nn's FullyConnectedNet: outputs, first and second derivatives
(what a force-trained step takes), on its own and inside a MACE model; state_dict, unfold and
pickling unchanged."""

from __future__ import annotations

import mace  # noqa: F401  (import mace before e3nn)
import pytest
import torch
from e3nn.nn import FullyConnectedNet
from test_fuse import assert_swap_exact_and_round_trips, rel_err

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
