"""The fused ops' large dense products on oneDNN (cfmtrain.kernels.dense): the same numbers as
torch's matmul, derivatives of every order, small products left on torch.mm, and the switch that
turns it off."""

import mace.modules  # noqa: F401  (import mace before e3nn)
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from cfmtrain.kernels import dense
from cfmtrain.kernels.conv import channelwise_conv, conv_descriptor, conv_graph
from cfmtrain.kernels.dense import dense_matmul, dense_mm, uses_onednn

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="this torch has no oneDNN")  # (every PyPI CPU wheel has)

ONEDNN = "mkldnn::_linear_pointwise"


@pytest.fixture
def any_size(monkeypatch):
    """oneDNN for every float32 product, however small (the tests' are)."""
    monkeypatch.setattr(dense, "ONEDNN_MIN_FLOPS", 0.0)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def onednn_calls(fn) -> int:
    """How many oneDNN matmuls `fn()` runs."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == ONEDNN)


@pytest.mark.parametrize("case", ["plain", "a transposed", "b transposed", "rows of a tile",
                                  "no rows"])
def test_dense_mm_equals_float64_product_for_any_strides(any_size, case):
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(70, 64, generator=gen), torch.randn(64, 33, generator=gen)
    if case == "a transposed":
        a = torch.randn(64, 70, generator=gen).t()
    elif case == "b transposed":
        b = torch.randn(33, 64, generator=gen).t()
    elif case == "rows of a tile":
        a = torch.randn(128, 64, generator=gen).narrow(0, 5, 70)
    elif case == "no rows":
        a = a[:0]
    out = dense_mm(a, b)
    assert out.shape == (a.shape[0], 33) and out.dtype == torch.float32
    if a.shape[0]:
        assert onednn_calls(lambda: dense_mm(a, b)) == 1
        assert rel_err(out, a.double() @ b.double()) < 1e-6


def test_only_products_of_a_gigaflop_go_to_onednn():
    """A primitive per new shape costs up to 1.5 ms; small products (a training batch's edge
    count changes every step) stay on torch.mm."""
    small = torch.randn(500, 64), torch.randn(64, 128)
    large = torch.randn(4000, 128), torch.randn(128, 1000)  # 1.02 GFLOP
    assert onednn_calls(lambda: dense_mm(*small)) == 0
    assert onednn_calls(lambda: dense_mm(*large)) == 1
    assert rel_err(dense_mm(*large), large[0].double() @ large[1].double()) < 1e-6


def test_dense_matmul_derivatives_to_second_order_equal_torch(any_size):
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
    assert onednn_calls(lambda: derivatives(dense_matmul)) >= 3  # forward, a's grads


def test_onednn_only_for_float32_and_while_enabled(any_size):
    x = torch.randn(4, 4)
    assert uses_onednn(x) and not uses_onednn(x.double())
    with torch.backends.mkldnn.flags(enabled=False):
        assert not uses_onednn(x)
        assert onednn_calls(lambda: dense_mm(x, x)) == 0
    assert onednn_calls(lambda: dense_mm(x.double(), x.double())) == 0


def test_conv_forms_factored_weights_on_onednn_with_the_same_numbers(any_size):
    """The conv's weight rows formed once for a step (keep_rows) on oneDNN for float32;
    turned off, torch.mm gives the same message and derivatives."""
    from e3nn import o3
    from mace.modules.irreps_tools import tp_out_irreps_with_instructions
    from mace.modules.wrapper_ops import TensorProduct

    irreps, sh = o3.Irreps("8x0e+8x1o"), o3.Irreps.spherical_harmonics(2)
    mid, instructions = tp_out_irreps_with_instructions(irreps, sh, sh.sort()[0].simplify())
    tp = TensorProduct(irreps, sh, mid, instructions=instructions, shared_weights=False,
                       internal_weights=False)
    gen = torch.Generator().manual_seed(2)
    edge_index = torch.randint(0, 30, (2, 600), generator=gen)
    desc, graph = conv_descriptor(tp), conv_graph(edge_index, 30)
    x = torch.randn(30, irreps.dim, generator=gen, requires_grad=True)
    y = torch.randn(600, sh.dim, generator=gen, requires_grad=True)
    h = torch.randn(600, 16, generator=gen, requires_grad=True)
    basis = torch.randn(16, tp.weight_numel, generator=gen, requires_grad=True)
    cot = torch.randn(30, tp.irreps_out.dim, generator=gen)

    def run():
        out = channelwise_conv(x, y, h, graph, desc, basis=basis, keep_rows=True)
        grads = torch.autograd.grad((out * cot).sum(), (x, y, h, basis))
        return [out, *grads]

    calls, ours = onednn_calls(run), run()
    with torch.backends.mkldnn.flags(enabled=False):
        assert onednn_calls(run) == 0
        plain = run()
    assert calls > 0
    for a, b in zip(ours, plain, strict=True):
        assert rel_err(a, b) < 1e-5
