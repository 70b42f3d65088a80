"""The fused message reshape against mace-torch's reshape_irreps: outputs, first and second
derivatives, on its own and inside a MACE model; no zero-filled slice gradients; state_dict,
unfuse and pickling unchanged."""

from __future__ import annotations

import mace  # noqa: F401  (import mace before e3nn)
import pytest
import torch
from e3nn import o3
from helpers import assert_swap_exact_and_round_trips
from mace.modules.irreps_tools import reshape_irreps

from cfmtrain.kernels.reshape import FusedReshape, fuse_reshapes, unfuse_reshapes


def second_order(module: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Output, d(sum w * out^2)/dx and the derivative of |that|^2 w.r.t. x (a double backward)."""
    x = x.clone().requires_grad_(True)
    out = module(x)
    weight = torch.linspace(0.5, 1.5, out.numel(), dtype=x.dtype).view_as(out)
    (dx,) = torch.autograd.grad((weight * out.pow(2)).sum(), x, create_graph=True)
    (ddx,) = torch.autograd.grad(dx.pow(3).sum(), x)
    return [out.detach(), dx.detach(), ddx]


@pytest.mark.parametrize("irreps", ["4x0e+4x1o+4x2e+4x3o", "3x0e", "2x0e+2x1o"])
def test_fused_reshape_equals_mace_to_second_order(irreps):
    original = reshape_irreps(o3.Irreps(irreps))
    x = torch.randn(7, o3.Irreps(irreps).dim, dtype=torch.float64)
    fused = FusedReshape(original)
    for got, want in zip(second_order(fused, x), second_order(original, x), strict=True):
        assert torch.equal(got, want)
    assert fused(x).shape == original(x).shape


def test_fused_reshape_makes_no_zero_filled_slice_gradients():
    irreps = o3.Irreps("16x0e+16x1o+16x2e+16x3o")
    x = torch.randn(50, irreps.dim, requires_grad=True)
    counts = {}
    for name, module in (("mace", reshape_irreps(irreps)),
                         ("fused", FusedReshape(reshape_irreps(irreps)))):
        with torch.profiler.profile() as prof:
            module(x).pow(2).sum().backward()
        counts[name] = sum(e.count for e in prof.key_averages() if e.key == "aten::slice_backward")
    assert counts == {"mace": 4, "fused": 0}


def test_several_multiplicities_are_refused():
    with pytest.raises(TypeError, match="one multiplicity"):
        FusedReshape(reshape_irreps(o3.Irreps("4x0e+2x1o")))


@pytest.mark.slow
def test_fused_reshape_in_a_model_matches_mace_and_round_trips():
    assert_swap_exact_and_round_trips(fuse_reshapes, unfuse_reshapes, "reshape", FusedReshape,
                                      1e-13)
