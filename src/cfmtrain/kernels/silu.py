"""SiLU for the radial MLP, with its second derivative in one compiled pass.

Forward and first derivative are torch's own fused `silu` and `silu_backward`. A force-trained
step differentiates the first derivative again (the forces' `autograd.grad` runs with
`create_graph`); torch's formula for that is about a dozen element-wise passes over
[edges, hidden] per layer, `cfmtrain::silu_grad_grad` (kernels/silu.cpp) is one. Higher orders
(a backward that itself builds a graph) use the same formula in differentiable torch ops.
"""

from __future__ import annotations

import torch

from cfmtrain.kernels.backend import compiled_ops, ops_built

_OPS = compiled_ops("cfmtrain._ops_silu")  # ops raise at first call if not built


def _silu_grad_grad_fake(gg, grad, x, s):
    return torch.empty_like(x), torch.empty_like(x)


if ops_built(_OPS):
    torch.library.register_fake("cfmtrain::silu_grad_grad")(_silu_grad_grad_fake)


def _derivatives(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """silu'(x) and silu''(x) in differentiable torch ops."""
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s)), s * (1 - s) * (2 + x * (1 - 2 * s))


class _SiluGrad(torch.autograd.Function):
    """g * silu'(x), differentiable in g and x."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(g, x)
        return torch.ops.aten.silu_backward(g, x)

    @staticmethod
    def backward(ctx, gg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g, x = ctx.saved_tensors
        if torch.is_grad_enabled() or x.device.type != "cpu":  # a graph of this backward
            d1, d2 = _derivatives(x)
            return gg * d1, gg * g * d2
        return _OPS.silu_grad_grad(gg.contiguous(), g.contiguous(), x.contiguous(),
                                   torch.sigmoid(x).contiguous())


class _Silu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.nn.functional.silu(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the derivative is differentiated again
            return _SiluGrad.apply(g, x)
        return torch.ops.aten.silu_backward(g, x)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x), as torch.nn.functional.silu, with a fused second derivative (eager;
    under torch.compile torch's own, which dynamo differentiates to every order)."""
    if torch.compiler.is_compiling():
        return torch.nn.functional.silu(x)
    return _Silu.apply(x)
