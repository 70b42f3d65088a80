"""The fused message linear (kernels.linear) against e3nn's o3.Linear: outputs and derivatives to
second order, alone and inside MACE models, also taking the fused conv's ir_mul message; no
zero-filled slice gradients; state_dict, unfuse and pickling unchanged."""

from __future__ import annotations

import io

import mace  # noqa: F401  (import mace before e3nn)
import pytest
import torch
from e3nn import o3
from helpers import (
    assert_swap_exact_and_round_trips,
    atoms,
    batch_dict,
    energy_forces_grads,
    rel_err,
    small_model,
)

from cfmtrain.kernels import fuse_model
from cfmtrain.kernels.conv import _ir_mul_order, unfuse_convs
from cfmtrain.kernels.linear import FusedLinear, fuse_linears, unfuse_linears


def second_order(module, x):
    """Output, d(sum w * out^2)/dx and the gradients of |that|^2 w.r.t. x and the weights."""
    x = x.clone().requires_grad_(True)
    out = module(x)
    weight = torch.linspace(0.5, 1.5, out.numel(), dtype=x.dtype).view_as(out)
    (dx,) = torch.autograd.grad((weight * out.pow(2)).sum(), x, create_graph=True)
    second = torch.autograd.grad(dx.pow(2).sum(), [x, *module.parameters()])
    return [out.detach(), dx.detach(), *second]


@pytest.mark.parametrize("irreps_in,irreps_out", [
    ("4x0e+3x1o+2x0e+2x1o+2x2e+1x3o", "5x0e+3x1o+2x2e+2x3o"),  # two blocks into one output
    ("3x0e+2x1o", "4x0e+3x1o+2x2e"),  # an output block no input reaches: zeros
])
def test_fused_linear_equals_e3nn_to_second_order(irreps_in, irreps_out):
    torch.manual_seed(0)
    linear = o3.Linear(irreps_in, irreps_out).double()
    fused = FusedLinear(linear)
    assert all(p is q for p, q in zip(fused.parameters(), linear.parameters(), strict=True))
    x = torch.randn(9, linear.irreps_in.dim, dtype=torch.float64)
    want = second_order(linear, x)
    for got, ref in zip(second_order(fused, x), want, strict=True):
        assert rel_err(got, ref) < 1e-13
    # the same input in the conv kernels' ir_mul layout (per block [nodes, dim, mul])
    order, inverse = _ir_mul_order(linear.irreps_in)
    fused.ir_mul_input = True
    got = second_order(fused, x[:, order])
    got[1], got[2] = got[1][:, inverse], got[2][:, inverse]  # d/dx back in mul_ir
    for g, ref in zip(got, want, strict=True):
        assert rel_err(g, ref) < 1e-13


def test_backward_fills_no_message_sized_zeros():
    """e3nn zero-fills a whole-input gradient per input block; the fused backward none."""
    linear = o3.Linear("4x0e+4x1o+4x2e+4x3o+4x1e+4x2o", "4x0e+4x1o+4x2e+4x3o").double()
    x = torch.randn(50, linear.irreps_in.dim, dtype=torch.float64, requires_grad=True)

    def fills(module) -> int:
        out = module(x)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    record_shapes=True) as prof:
            out.backward(torch.ones_like(out))
        return sum(1 for e in prof.events() if e.name in ("aten::fill_", "aten::zero_")
                   and e.input_shapes and e.input_shapes[0] == list(x.shape))

    assert fills(linear) >= 4  # one per input block that reaches an output
    assert fills(FusedLinear(linear)) == 0


def test_biases_are_refused():
    with pytest.raises(TypeError, match="no biases"):
        FusedLinear(o3.Linear("2x0e", "2x0e", biases=True))


def test_fused_linear_model_matches_mace_and_round_trips():
    assert_swap_exact_and_round_trips(fuse_linears, unfuse_linears, "linear", FusedLinear, 1e-12)


def test_conv_hands_its_message_over_and_every_unfuse_takes_it_back():
    """fuse_model has each fused conv give its FusedLinear the ir_mul message; the model stays
    exact after torch.save/load (the hand-over restored), after unfusing only the linears, and
    after unfusing only the convs."""
    model = small_model()
    batch = batch_dict(atoms())
    expected = energy_forces_grads(model, batch)

    def handed(m) -> list[bool]:
        return [b.conv_tp._linear is b.linear and b.linear.ir_mul_input for b in m.interactions]

    def assert_exact(m):
        for got, want in zip(energy_forces_grads(m, batch), expected, strict=True):
            assert rel_err(got, want) < 1e-12

    fuse_model(model)
    assert handed(model) == [True, True]
    assert_exact(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    assert handed(model) == [True, True]  # saving leaves the live model as it was
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    assert handed(loaded) == [True, True]
    assert_exact(loaded)
    unfuse_linears(model)  # e3nn's Linear takes mul_ir: the conv gives mul_ir again
    assert [b.conv_tp._linear for b in model.interactions] == [None, None]
    assert_exact(model)
    fuse_model(model)
    assert handed(model) == [True, True]
    unfuse_convs(model)  # e3nn's TensorProduct gives mul_ir: the linear takes mul_ir again
    assert [b.linear.ir_mul_input for b in model.interactions] == [False, False]
    assert_exact(model)
