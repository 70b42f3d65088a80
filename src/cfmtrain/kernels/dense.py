"""Dense products of the fused ops' weight paths, on the matmul that is fastest on this CPU.

float32 goes through oneDNN's matmul (`torch.ops.mkldnn._linear_pointwise`), which picks its
kernels by the CPU's instruction set; MKL's sgemm, behind `torch.mm`, takes its AVX2 code on AMD
CPUs. On a Zen 5 with AVX-512 (2 threads) oneDNN ran the conv's [E x 64] @ [64 x w] products
2.0-2.3x and the radial MLP's [E x 8-64] @ [8-64 x 64] 2.2-4x faster, but not the reductions over
the edges ([64 x E] @ [E x 64]: 0.75x), which stay on `torch.mm`. The compiled kernels use the
same rule (kernels/common/dense_mm.h).
"""

from __future__ import annotations

import torch


def uses_onednn(a: torch.Tensor) -> bool:
    """Whether `dense_mm` of this operand runs on oneDNN: float32 on the CPU, oneDNN enabled, and
    not while torch.compile traces (checked first: reading torch.backends' flags breaks dynamo's
    graph, and a force graph broken there came out with zero forces; inductor picks its own
    matmul)."""
    if torch.compiler.is_compiling():
        return False
    return (a.dtype == torch.float32 and a.device.type == "cpu"
            and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)


def dense_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [m, k] @ b [k, n] (any strides), not differentiable (`dense_matmul` is)."""
    if not uses_onednn(a) or 0 in (*a.shape, b.shape[1]):
        return a @ b
    return torch.ops.mkldnn._linear_pointwise(a, b.t(), None, "none", [], None)


class _DenseMM(torch.autograd.Function):
    """a @ b by `dense_mm`, differentiable to any order (its backward is `dense_matmul` again
    for a's gradient; b's, a reduction over a's rows, is torch's)."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return dense_mm(a, b)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        return (dense_matmul(grad, b.t()) if need_a else None,
                a.t() @ grad if need_b else None)


def dense_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [m, k] @ b [k, n] through autograd, on oneDNN where `uses_onednn`."""
    if not uses_onednn(a):
        return a @ b
    return _DenseMM.apply(a, b)
