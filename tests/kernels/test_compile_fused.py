"""torch.compile of the fused ops and of a whole fused model's force-training step: compiled
gradients equal eager ones, which the other tests tie to mace-torch."""

from __future__ import annotations

import e3nn
import mace  # noqa: F401  (import mace before e3nn)
import pytest
import torch
from helpers import make_tp
from mace.tools.compile import configure_autograd_for_compile, disable_e3nn_codegen

from cfmtrain.bench.kernels_worker import make_batch, paper_model, supercell
from cfmtrain.kernels import dense, fuse_model, prepare_for_compile, unfuse_model, without_codegen
from cfmtrain.kernels.conv import channelwise_conv, conv_descriptor, conv_graph
from cfmtrain.kernels.sparse_polynomial import _REGISTRY

pytestmark = pytest.mark.slow  # torch.compile: about 2 minutes here


@pytest.fixture
def float64_no_codegen():
    """float64 modules (CG buffers exact) without e3nn's TorchScript code (dynamo cannot trace
    it), and a clean dynamo cache afterwards."""
    old, options = torch.get_default_dtype(), e3nn.get_optimization_defaults()
    torch.set_default_dtype(torch.float64)
    e3nn.set_optimization_defaults(jit_script_fx=False)
    yield
    torch.set_default_dtype(old)
    e3nn.set_optimization_defaults(**options)
    torch._dynamo.reset()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("factored", [False, True])
def test_conv_force_loss_gradients_compile_to_eager(float64_no_codegen, factored):
    """A force-like loss through the fused conv (energy, its gradient w.r.t. the edge attributes
    traced into the graph, the gradient of both w.r.t. the rest) in one fullgraph compile: the
    message's mul_ir/ir_mul permutation (its backward is itself differentiated) must reach the
    second derivative; dynamo took the eager autograd.Function's backward as final (3-5% off)."""
    configure_autograd_for_compile(True)
    tp = make_tp("2x0e+2x1o", 2)
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 9, (2, 40), generator=gen)
    desc = conv_descriptor(tp)
    x = torch.randn(9, tp.irreps_in1.dim, generator=gen).requires_grad_()
    y = torch.randn(40, 9, generator=gen).requires_grad_()
    k = 3 if factored else tp.weight_numel
    w0, wp = torch.randn(40, k, generator=gen), torch.randn(40, k, generator=gen)
    wp.requires_grad_()
    basis = torch.randn(k, tp.weight_numel, generator=gen).requires_grad_()
    cot = torch.randn(9, tp.irreps_out.dim, generator=gen)
    assert desc.x_order is not None and desc.o_order is not None  # permutations in the path

    def energy_and_force(x, y, wp, basis, edge_index):
        out = channelwise_conv(x, y, w0 * wp, conv_graph(edge_index, 9), desc,
                               basis if factored else None)
        energy = (out * cot).sum() + (out**2).sum()
        (force,) = torch.autograd.grad(energy, [y], create_graph=True)
        return energy, force

    def gradients(fn):
        energy, force = fn(x, y, wp, basis, edge_index)
        loss = energy**2 + (force**2).sum()
        return [loss, *torch.autograd.grad(loss, [x, wp, basis] if factored else [x, wp])]

    eager = gradients(energy_and_force)
    compiled = gradients(torch.compile(energy_and_force, fullgraph=True))
    for a, b in zip(compiled, eager, strict=True):
        assert rel(a, b) < 1e-12


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_fused_model_training_step_compiles_to_eager(float64_no_codegen, tmp_path, monkeypatch,
                                                     dtype, tol):
    """A whole fused model (every fusion: contraction, conv with its radial MLP, reshape, linear,
    element skip) prepared for torch.compile: energy, forces and the force-training loss's
    parameter gradients of the compiled model equal the eager fused model's (float32: whose
    eager products run on oneDNN, kernels.dense, here at any size, and whose compiled ones must
    not: deciding that once broke dynamo's graph and gave zero forces). Compiled first,
    with no derivative descriptor cached, as in a fresh process: the contraction's derivative
    descriptors are then made while dynamo traces, and once held fake tensors of that trace
    (inductor: "Mixing fake modes")."""
    monkeypatch.setattr(dense, "ONEDNN_MIN_FLOPS", 0.0)  # the tiny model's products too
    for desc in list(_REGISTRY.values()):
        desc._derivatives.clear()
    path = tmp_path / "tiny.model"  # as the README: a model file, loaded and rebuilt
    torch.save(paper_model(dtype, False, size="tiny"), path)
    model = prepare_for_compile(fuse_model(without_codegen(torch.load(path, weights_only=False))))
    backend = model.cfmtrain_kernel_backend
    assert backend == {"symmetric_contraction": "cpu-fused", "conv": "cpu-fused"}
    batch = make_batch(supercell(32), dtype)
    batch["positions"].requires_grad_(True)  # a compiled graph cannot turn it on for an input
    params = [p for p in model.parameters() if p.requires_grad]

    def step(m):
        out = m(dict(batch), training=True, compute_force=True)
        loss = out["energy"].pow(2).mean() + 10.0 * out["forces"].pow(2).mean()
        return [out["energy"], out["forces"], loss, *torch.autograd.grad(loss, params)]

    compiled = step(torch.compile(model))
    eager = step(model)
    assert eager[1].abs().max() > 0
    for a, b in zip(compiled, eager, strict=True):
        assert rel(a, b) < tol


def test_prepare_for_compile_refuses_torchscript_submodules(tmp_path):
    """A model with e3nn's generated TorchScript code (built with it, or loaded: the file keeps
    it even under disable_e3nn_codegen) cannot be traced: the error says what to do instead;
    `without_codegen` rebuilds it without the code and with the same outputs."""
    model = paper_model(torch.float64, False, size="tiny")
    path = tmp_path / "tiny.model"
    torch.save(model, path)
    with disable_e3nn_codegen():
        loaded = torch.load(path, weights_only=False)
    for scripted in (model, loaded):
        with pytest.raises(ValueError, match="disable_e3nn_codegen.*without_codegen"):
            prepare_for_compile(fuse_model(scripted))
    rebuilt = without_codegen(model)
    assert not any(isinstance(m, torch.jit.ScriptModule) for m in rebuilt.modules())
    batch = make_batch(supercell(32), torch.float64)
    assert torch.equal(rebuilt(dict(batch))["energy"], unfuse_model(model)(dict(batch))["energy"])
