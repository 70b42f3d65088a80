"""The fused element self-connection (kernels.skip) against e3nn's fully connected tensor product
with one-hot attributes: outputs and derivatives to second order, alone and inside MACE models;
the fallback for attributes that are not one-hot; state_dict, unfuse and pickling unchanged."""

from __future__ import annotations

import mace  # noqa: F401  (import mace before e3nn)
import pytest
import torch
from e3nn import o3
from helpers import assert_swap_exact_and_round_trips, rel_err

from cfmtrain.kernels.skip import FusedSkipTP, fuse_skips, unfuse_skips


def second_order(module, x, attrs):
    """Output, d(sum w * out^2)/dx and the gradients of |that|^2 w.r.t. x and the weights."""
    x = x.clone().requires_grad_(True)
    out = module(x, attrs)
    weight = torch.linspace(0.5, 1.5, out.numel(), dtype=x.dtype).view_as(out)
    (dx,) = torch.autograd.grad((weight * out.pow(2)).sum(), x, create_graph=True)
    second = torch.autograd.grad(dx.pow(2).sum(), [x, *module.parameters()])
    return [out.detach(), dx.detach(), *second]


@pytest.mark.parametrize("irreps_in,irreps_out", [
    ("4x0e+3x1o+2x2e", "5x0e+3x1o+2x2e+2x3o"),  # an output block no path reaches: zeros
    ("3x0e+2x0e+2x1o", "4x0e+3x1o"),  # two input blocks into one output block
])
def test_fused_skip_equals_e3nn_to_second_order(irreps_in, irreps_out):
    torch.manual_seed(0)
    tp = o3.FullyConnectedTensorProduct(irreps_in, "6x0e", irreps_out).double()
    fused = FusedSkipTP(tp)
    assert all(p is q for p, q in zip(fused.parameters(), tp.parameters(), strict=True))
    x = torch.randn(11, tp.irreps_in1.dim, dtype=torch.float64)
    elements = torch.tensor([5, 0, 2, 2, 5, 0, 0, 3, 2, 5, 0])  # 1 and 4 absent
    attrs = torch.nn.functional.one_hot(elements, 6).double()
    for got, want in zip(second_order(fused, x, attrs), second_order(tp, x, attrs), strict=True):
        assert rel_err(got, want) < 1e-13


def test_attributes_that_are_not_one_hot_go_through_e3nn():
    torch.manual_seed(1)
    tp = o3.FullyConnectedTensorProduct("3x0e+2x1o", "4x0e", "3x0e+2x1o").double()
    fused = FusedSkipTP(tp)
    x = torch.randn(5, tp.irreps_in1.dim, dtype=torch.float64)
    soft = torch.rand(5, 4, dtype=torch.float64)
    assert rel_err(fused(x, soft), tp(x, soft)) < 1e-13
    attrs = torch.nn.functional.one_hot(torch.tensor([0, 1, 2, 3, 0]), 4).double()
    attrs.requires_grad_(True)
    (got,) = torch.autograd.grad(fused(x, attrs).sum(), attrs)
    (want,) = torch.autograd.grad(tp(x, attrs).sum(), attrs)
    assert rel_err(got, want) < 1e-13


def test_unsupported_tensor_products_are_refused():
    with pytest.raises(TypeError, match="scalar attributes"):
        FusedSkipTP(o3.FullyConnectedTensorProduct("2x0e+2x1o", "2x0e+1x1o", "2x0e+2x1o"))


def test_fused_skip_model_matches_mace_and_round_trips():
    assert_swap_exact_and_round_trips(fuse_skips, unfuse_skips, "skip_tp", FusedSkipTP, 1e-12)
