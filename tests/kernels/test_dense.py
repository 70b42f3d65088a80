"""The fused ops' dense products (cfmtrain.kernels.dense, kernels/common/gemm.h): the AVX-512
product where this CPU has it, with the float64 product's numbers for every shape, stride and
block remainder, derivatives of every order, and the conv's chunk products equal to at::mm's
(CFMTRAIN_GEMM=aten, in a separate process)."""

import json
import os
import subprocess
import sys

import mace.modules  # noqa: F401  (import mace before e3nn)
import pytest
import torch

from cfmtrain.kernels import dense, isa
from cfmtrain.kernels.dense import dense_matmul, dense_mm, gemm_backend, product_library


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def test_backend_is_avx512_exactly_where_the_cpu_has_it():
    expected = "avx512" if "avx512f" in isa.cpu_flags() else "aten"
    assert gemm_backend() == expected


# m, k, n around the 8 x 32 register blocks, the 96-row passes and the 256-deep inner slices
SHAPES = [(1, 1, 1), (7, 3, 15), (8, 64, 32), (9, 64, 33), (70, 64, 1280), (97, 5, 17),
          (200, 300, 47), (64, 600, 64), (31, 513, 200), (5, 0, 9), (0, 4, 4), (300, 64, 8)]


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("layout", ["plain", "a transposed", "b transposed", "rows of a tile"])
def test_dense_mm_equals_float64_product(m, k, n, layout):
    gen = torch.Generator().manual_seed(m * 1000 + k * 10 + n)
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    if layout == "a transposed":
        a = torch.randn(k, m, generator=gen).t()
    elif layout == "b transposed":
        b = torch.randn(n, k, generator=gen).t()
    elif layout == "rows of a tile":
        a = torch.randn(m + 9, k + 3, generator=gen)[5:5 + m, 2:2 + k]
    out = torch.ops.cfmtrain.dense_mm(a, b)
    assert out.shape == (m, n) and out.dtype == torch.float32 and out.is_contiguous()
    ref = a.double() @ b.double()
    if m and n:
        scale = max(ref.abs().max().item(), 1.0)
        assert (out.double() - ref).abs().max().item() <= 1e-5 * scale * max(k, 1) ** 0.5
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_dense_mm_same_numbers_on_any_thread_count(threads):
    """Rows or columns split over threads: each element is one thread's sum, in one order (on
    the AVX-512 product)."""
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(40, 700, generator=gen), torch.randn(700, 300, generator=gen)
    tall = torch.randn(500, 64, generator=gen), torch.randn(64, 100, generator=gen)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ones = [torch.ops.cfmtrain.dense_mm(*p) for p in (wide, tall)]
        torch.set_num_threads(threads)
        many = [torch.ops.cfmtrain.dense_mm(*p) for p in (wide, tall)]
    finally:
        torch.set_num_threads(before)
    for x, y in zip(ones, many, strict=True):
        if gemm_backend() == "avx512":
            assert torch.equal(x, y)
        else:  # at::mm's: MKL may split the sums differently
            assert rel_err(x, y) < 1e-6


def test_dense_mm_rejects_bad_operands():
    with pytest.raises(RuntimeError, match="do not chain"):
        torch.ops.cfmtrain.dense_mm(torch.ones(3, 4), torch.ones(5, 2))
    with pytest.raises(RuntimeError, match="2-D"):
        torch.ops.cfmtrain.dense_mm(torch.ones(3), torch.ones(3, 2))
    with pytest.raises(RuntimeError, match="Double"):
        torch.ops.cfmtrain.dense_mm(torch.ones(3, 4), torch.ones(4, 2, dtype=torch.float64))


SMALL = "avx512" if "avx512f" in isa.cpu_flags() else "torch"


def test_each_product_on_the_library_for_its_size():
    """Products of a gigaflop on oneDNN (a primitive per new shape costs up to 1.5 ms), smaller
    float32 ones on the AVX-512 product, float64 and traced ones on torch.mm."""
    small = torch.randn(500, 64), torch.randn(64, 128)
    large = torch.randn(4000, 128), torch.randn(128, 1000)  # 1.02 GFLOP
    assert product_library(*small) == SMALL
    assert product_library(*large) == "onednn"
    with torch.backends.mkldnn.flags(enabled=False):
        assert product_library(*large) == SMALL
    assert product_library(small[0].double(), small[1].double()) == "torch"
    for pair in (small, large):
        assert rel_err(dense_mm(*pair), pair[0].double() @ pair[1].double()) < 1e-6
    x = torch.randn(4, 4)
    assert torch.equal(dense_mm(x.double(), x.double()), x.double() @ x.double())
    compiled = torch.compile(lambda a, b: dense_mm(a, b) + 1, backend="eager", fullgraph=True)
    assert rel_err(compiled(x, x), x.double() @ x.double() + 1) < 1e-6


@pytest.mark.parametrize("onednn", [False, True])
def test_dense_matmul_derivatives_to_second_order_equal_torch(monkeypatch, onednn):
    if onednn:  # every product on oneDNN, however small
        monkeypatch.setattr(dense, "ONEDNN_MIN_FLOPS", 0.0)
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(50, 16, generator=gen, requires_grad=True)
    b = torch.randn(16, 24, generator=gen, requires_grad=True)
    cot = torch.randn(50, 24, generator=gen)

    def derivatives(mm):
        out = torch.tanh(mm(a, b))  # a non-linearity, so that second derivatives do not vanish
        ga, gb = torch.autograd.grad((out * cot).sum(), (a, b), create_graph=True)
        second = torch.autograd.grad((ga**2).sum() + (gb**2).sum(), (a, b))
        return [out, ga, gb, *second]

    ours, ref = derivatives(dense_matmul), derivatives(torch.matmul)
    for x, y in zip(ours, ref, strict=True):
        assert rel_err(x, y) < 1e-5


CONV_SCRIPT = r"""
import json, sys
import mace.modules  # noqa: F401
import torch
from e3nn import o3
from mace.modules.irreps_tools import tp_out_irreps_with_instructions
from mace.modules.wrapper_ops import TensorProduct
from cfmtrain.kernels.conv import channelwise_conv, conv_descriptor, conv_graph
from cfmtrain.kernels.dense import gemm_backend

irreps, sh = o3.Irreps("8x0e+8x1o"), o3.Irreps.spherical_harmonics(2)
mid, instructions = tp_out_irreps_with_instructions(irreps, sh, sh.sort()[0].simplify())
tp = TensorProduct(irreps, sh, mid, instructions=instructions, shared_weights=False,
                   internal_weights=False)
gen = torch.Generator().manual_seed(2)
edge_index = torch.randint(0, 30, (2, 900), generator=gen)
desc, graph = conv_descriptor(tp), conv_graph(edge_index, 30)
x = torch.randn(30, irreps.dim, generator=gen, requires_grad=True)
y = torch.randn(900, sh.dim, generator=gen, requires_grad=True)
h = torch.randn(900, 16, generator=gen, requires_grad=True)
basis = torch.randn(16, tp.weight_numel, generator=gen, requires_grad=True)
cot = torch.randn(30, tp.irreps_out.dim, generator=gen)
result = {"backend": gemm_backend()}
for keep_rows in (False, True):  # weights formed chunk by chunk in the kernels, or once
    out = channelwise_conv(x, y, h, graph, desc, basis=basis, keep_rows=keep_rows)
    # without a graph the kernels contract the chunks' weight gradients (dH, dB) themselves
    first = torch.autograd.grad((out * cot).sum(), (x, y, h, basis), retain_graph=True)
    grads = torch.autograd.grad((out * cot).sum(), (x, y, h, basis), create_graph=True)
    second = torch.autograd.grad(sum((g**2).sum() for g in grads), (x, h, basis))
    result[str(keep_rows)] = [t.double().flatten().tolist()
                              for t in (out, *first, *grads, *second)]
json.dump(result, sys.stdout)
"""


def conv_in_process(env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", CONV_SCRIPT], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
def test_conv_chunk_products_equal_aten():
    """The conv's float32 chunk products (forming weight rows, their dH, the summed dB) and the
    whole-edge ones give at::mm's numbers to first and second order."""
    ours, aten = conv_in_process({}), conv_in_process({"CFMTRAIN_GEMM": "aten"})
    assert aten["backend"] == "aten" and ours["backend"] == gemm_backend()
    for keep_rows in ("False", "True"):
        for a, b in zip(ours[keep_rows], aten[keep_rows], strict=True):
            a, b = torch.tensor(a), torch.tensor(b)
            assert rel_err(a, b) < 1e-5


def test_flop_counter_counts_every_library():
    from cfmtrain.bench.flops import count_flops

    a, b = torch.randn(300, 40), torch.randn(40, 50)
    assert count_flops(lambda: torch.ops.cfmtrain.dense_mm(a, b)) == 2 * 300 * 40 * 50
    assert count_flops(lambda: dense.onednn_mm(a, b)) == 2 * 300 * 40 * 50


def test_opcheck_schema_and_fake():
    from torch.library import opcheck

    gen = torch.Generator().manual_seed(4)
    for a, b in ((torch.randn(20, 7, generator=gen), torch.randn(7, 40, generator=gen)),
                 (torch.randn(7, 20, generator=gen).t(), torch.randn(40, 7, generator=gen).t())):
        opcheck(torch.ops.cfmtrain.dense_mm.default, (a, b))
