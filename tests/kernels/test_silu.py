"""The radial MLP's SiLU (cfmtrain.kernels.silu) against torch's: values and derivatives to third
order, the compiled second derivative against autograd of torch's silu, opcheck, bad input."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from cfmtrain.kernels.silu import silu


def test_gradients_to_third_order_float64():
    torch.manual_seed(0)
    x = torch.randn(40, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(silu, (x,))
    assert torch.autograd.gradgradcheck(silu, (x,))  # the compiled second derivative

    def force_like(x):  # a gradient with create_graph, differentiated twice more by the check
        (g,) = torch.autograd.grad(silu(x).pow(2).sum(), x, create_graph=True)
        return g

    assert torch.autograd.gradgradcheck(force_like, (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_double_backward_equals_torch_silu(dtype):
    """A force-trained step's pattern (grad with create_graph, then a backward of a loss of it),
    on a tensor large enough for the threaded loop, against torch's own silu."""
    torch.manual_seed(1)
    x0 = 4 * torch.randn(3001, 64, dtype=dtype)
    w, v = torch.randn_like(x0), torch.randn_like(x0)
    results = []
    for fn in (silu, torch.nn.functional.silu):
        x = x0.clone().requires_grad_(True)
        y = fn(x)
        (g,) = torch.autograd.grad((y * w).sum(), x, create_graph=True)
        ((g * v).sum() + (g * g).sum()).backward()
        results.append((y.detach(), g.detach(), x.grad))
    tol = 1e-6 if dtype == torch.float32 else 1e-14
    for got, want in zip(*results, strict=True):
        assert (got - want).abs().max() <= tol * want.abs().max()


def test_op_passes_opcheck():
    x = torch.randn(17, 5, dtype=torch.float64)
    args = (torch.randn_like(x), torch.randn_like(x), x, torch.sigmoid(x))
    opcheck(torch.ops.cfmtrain.silu_grad_grad.default, args)


def test_bad_input_names_the_argument():
    x = torch.randn(4, 3)
    with pytest.raises(RuntimeError, match="silu_grad_grad: grad must have shape"):
        torch.ops.cfmtrain.silu_grad_grad(x, torch.randn(4, 2), x, torch.sigmoid(x))
    with pytest.raises(RuntimeError, match="silu_grad_grad: s must be Float"):
        torch.ops.cfmtrain.silu_grad_grad(x, x, x, torch.sigmoid(x).double())
