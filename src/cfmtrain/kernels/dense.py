"""Dense products of the fused ops' weight paths, on the matmul that is fastest for their size.

MKL's sgemm, behind `torch.mm`, takes its AVX2 code on AMD CPUs, AVX-512 ones included. Two
others dispatch on the instruction set:
- oneDNN's matmul (`torch.ops.mkldnn._linear_pointwise`) for float32 products of at least
  ONEDNN_MIN_FLOPS: on a Zen 5 with AVX-512 it ran the conv's whole-edge [E x 64] @ [64 x w]
  products 2.0-2.3x faster than MKL. It builds a primitive for every new shape (0.6-1.5 ms
  here), and a training batch's edge count changes every step: only large products repay that.
- `cfmtrain::dense_mm` (kernels/dense_mm.cpp: the AVX-512 product of kernels/common/gemm.h,
  which the conv's and radial MLP's tiles use too) for smaller float32 ones, where the CPU has
  AVX-512: no set-up per shape, 1.2-2.8x MKL on the radial MLP's products here.
Otherwise (no AVX-512, float64, oneDNN disabled, or while torch.compile traces) `torch.mm`.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import register_flop_formula

from cfmtrain.kernels.backend import compiled_ops, ops_built

_OPS = compiled_ops("cfmtrain._ops_dense_mm")  # ops raise at first call if not built

# 1 GFLOP: ~6 ms of MKL on 2 threads here, ~3 ms saved, against <= 1.5 ms to build a primitive
ONEDNN_MIN_FLOPS = 1e9


def _dense_mm_fake(a, b):
    return a.new_empty((a.shape[0], b.shape[1]))


def _dense_mm_flops(a, b, out_val=None) -> int:
    """2 m k n (torch.utils.flop_counter, as for torch.mm)."""
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


if ops_built(_OPS):
    torch.library.register_fake("cfmtrain::dense_mm")(_dense_mm_fake)
    register_flop_formula(_OPS.dense_mm, get_raw=True)(_dense_mm_flops)


@register_flop_formula(torch.ops.mkldnn._linear_pointwise, get_raw=True)
def _onednn_flops(a, weight, *args, out_val=None, **kwargs) -> int:
    """oneDNN's linear (a @ weight^T) has no formula of torch's: without one the executed-FLOP
    counts missed the large products."""
    return 2 * (a.numel() // a.shape[-1]) * a.shape[-1] * weight.shape[0]


def gemm_backend() -> str:
    """"avx512" where float32 tiles and `dense_mm`'s smaller products take the AVX-512 product
    of kernels/common/gemm.h, else "aten" (no AVX-512, or CFMTRAIN_GEMM=aten, read once per
    process)."""
    return _OPS.dense_mm_backend()


_AVX512 = ops_built(_OPS) and gemm_backend() == "avx512"


def product_library(a: torch.Tensor, b: torch.Tensor) -> str:
    """Which matmul `dense_mm(a, b)` runs: "onednn", "avx512" or "torch". Decided on the trace
    first: reading torch.backends' flags while torch.compile traces broke dynamo's graph, and a
    force graph broken there came out with zero forces."""
    if torch.compiler.is_compiling():
        return "torch"
    if a.dtype != torch.float32 or a.device.type != "cpu":
        return "torch"
    if (2.0 * a.shape[0] * a.shape[1] * b.shape[1] >= ONEDNN_MIN_FLOPS
            and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return "onednn"
    return "avx512" if _AVX512 else "torch"


def onednn_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [m, k] @ b [k, n] (any strides, float32) on oneDNN, whatever its size."""
    return torch.ops.mkldnn._linear_pointwise(a, b.t(), None, "none", [], None)


def dense_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [m, k] @ b [k, n] (any strides), not differentiable (`dense_matmul` is)."""
    library = product_library(a, b)
    if library == "onednn":
        return onednn_mm(a, b)
    return _OPS.dense_mm(a, b) if library == "avx512" else a @ b


class _DenseMM(torch.autograd.Function):
    """a @ b by `dense_mm`, differentiable to any order (its backward is `dense_matmul` again)."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return dense_mm(a, b)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        return (dense_matmul(grad, b.t()) if need_a else None,
                dense_matmul(a.t(), grad) if need_b else None)


def dense_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [m, k] @ b [k, n] through autograd, off `torch.mm` where `product_library` says so."""
    if product_library(a, b) == "torch":
        return a @ b
    return _DenseMM.apply(a, b)
