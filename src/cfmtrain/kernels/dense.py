"""Large dense products of the fused ops' weight paths, on the matmul that is fastest on this CPU.

float32 products of at least ONEDNN_MIN_FLOPS go through oneDNN's matmul
(`torch.ops.mkldnn._linear_pointwise`), which picks its kernels by the CPU's instruction set;
MKL's sgemm, behind `torch.mm`, takes its AVX2 code on AMD CPUs. On a Zen 5 with AVX-512
(2 threads) oneDNN ran the conv's [E x 64] @ [64 x w] products 2.0-2.3x faster. Smaller ones stay
on `torch.mm`: oneDNN builds a primitive for every new shape (0.6-1.5 ms here), and a training
batch's edge count changes every step; with every product on oneDNN, the ablation's small-model
cells trained 2x slower.
"""

from __future__ import annotations

import torch

# 1 GFLOP: ~6 ms of MKL on 2 threads here, ~3 ms saved, against <= 1.5 ms to build a primitive
ONEDNN_MIN_FLOPS = 1e9


def uses_onednn(a: torch.Tensor, b: torch.Tensor | None = None) -> bool:
    """Whether `dense_mm(a, b)` runs on oneDNN: float32 on the CPU, oneDNN enabled, not while
    torch.compile traces (checked first: reading torch.backends' flags breaks dynamo's graph,
    and a force graph broken there came out with zero forces), and, given `b`, a product of at
    least ONEDNN_MIN_FLOPS."""
    if torch.compiler.is_compiling():
        return False
    if b is not None and 2.0 * a.shape[0] * a.shape[1] * b.shape[1] < ONEDNN_MIN_FLOPS:
        return False
    return (a.dtype == torch.float32 and a.device.type == "cpu"
            and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)


def onednn_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [m, k] @ b [k, n] (any strides, float32) on oneDNN, whatever its size."""
    return torch.ops.mkldnn._linear_pointwise(a, b.t(), None, "none", [], None)


def dense_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [m, k] @ b [k, n] (any strides), not differentiable (`dense_matmul` is)."""
    return onednn_mm(a, b) if uses_onednn(a, b) else a @ b


class _DenseMM(torch.autograd.Function):
    """a @ b by `dense_mm`, differentiable to any order (its backward is `dense_matmul` again
    for a's gradient; b's, a reduction over a's rows, is torch's: oneDNN measured 0.75x there)."""

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
    """a [m, k] @ b [k, n] through autograd, on oneDNN where `uses_onednn(a, b)`."""
    if not uses_onednn(a, b):
        return a @ b
    return _DenseMM.apply(a, b)
