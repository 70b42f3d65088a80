"""Both of the paper's kernels through cuEquivariance (the CUDA backend), run here on its PyTorch
fallback: each kernel on the project's kernel shapes, and whole models (the paper's, MACE-MP-0's
shapes) against mace-torch's e3nn code: energies, forces, stress and parameter gradients, in
float64 and in float32 (bounded by e3nn's own float32 error). A CUDA device gets both."""

from __future__ import annotations

import copy

import mace.modules  # noqa: F401  (import mace before e3nn)
import pytest
import torch
from e3nn import o3
from helpers import (  # noqa: F401  (small_and_serial: autouse, one thread, no e3nn TorchScript)
    atoms,
    batch_dict,
    make_tp,
    rel_err,
    small_and_serial,
    small_model,
)
from mace.modules.symmetric_contraction import SymmetricContraction
from test_conv import first_and_second_derivatives, mace_conv, random_inputs
from test_symmetric_contraction import make_inputs, make_sc, randomize_weights

from cfmtrain.bench.kernels_worker import paper_model, supercell
from cfmtrain.bench.md_worker import build_shape
from cfmtrain.kernels import backend as backend_module
from cfmtrain.kernels import fuse as fuse_module
from cfmtrain.kernels import fuse_model, kernel_backend, unfuse_model
from cfmtrain.kernels.cueq import ChannelwiseConvCueq, SymmetricContractionCueq
from cfmtrain.kernels.shapes import CONV_SHAPES, SC_SHAPES


@pytest.mark.parametrize("hidden,lmax", CONV_SHAPES)
def test_conv_and_its_derivatives_match_e3nn(float64_default, hidden, lmax):
    tp = make_tp(hidden, lmax)
    edge_index = torch.randint(0, 9, (2, 40), generator=torch.Generator().manual_seed(3))
    inputs = random_inputs(tp, edge_index, 9)
    conv = ChannelwiseConvCueq(copy.deepcopy(tp))
    ours = first_and_second_derivatives(lambda x, y, w: conv(x, y, w, edge_index), inputs)
    ref = first_and_second_derivatives(lambda x, y, w: mace_conv(tp, x, y, w, edge_index), inputs)
    for a, b in zip(ours, ref, strict=True):
        assert rel_err(a, b) < 1e-10


@pytest.mark.slow  # 10-30 s each on 2 cores
@pytest.mark.parametrize("shape", SC_SHAPES, ids=[str(s) for s in SC_SHAPES])
def test_symmetric_contraction_and_its_gradients_match_e3nn(shape):
    sc = make_sc(*shape)
    randomize_weights(sc)
    x, y = make_inputs(sc, 7)
    x.requires_grad_()
    cueq = SymmetricContractionCueq(sc, method="naive")

    def value_and_grads(f):
        out = f(x, y)
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(5),
                          dtype=out.dtype)
        params = [x, *sc.parameters()]
        grads = torch.autograd.grad((out * cot).sum(), params, allow_unused=True)
        return [out, *(torch.zeros_like(p) if g is None else g
                       for g, p in zip(grads, params, strict=True))]

    for a, b in zip(value_and_grads(cueq), value_and_grads(sc), strict=True):
        # cuet's basis reaches mace's by a projection mace checks only to 1e-7
        assert rel_err(a, b) < 1e-6


def everything(model, batch):
    """Energy, forces, stress and the parameter gradients of an energy+forces+stress loss."""
    out = model(dict(batch), training=True, compute_force=True, compute_stress=True)
    loss = out["energy"].pow(2).sum() + out["forces"].pow(2).sum() + out["stress"].pow(2).sum()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [out["energy"].detach(), out["forces"].detach(), out["stress"].detach(),
            *(torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True))]


MODELS = {  # built in float64; the float32 model is its copy cast
    "small": lambda: small_model(reduced=True),
    "mp0-small": lambda: build_shape("mp0-small", torch.float64),
    "mp0-medium": lambda: build_shape("mp0-medium", torch.float64),
    "paper": lambda: paper_model(torch.float64, reduced_cg=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_whole_models_match_e3nn_in_float64_and_float32(name):
    model = MODELS[name]()
    zs = [int(z) for z in model.atomic_numbers]
    structure = supercell(8) if name.startswith("mp0") else atoms((1, 1, 2))
    batch = {dtype: batch_dict(structure, dtype, zs) for dtype in (torch.float64, torch.float32)}
    e3nn32 = copy.deepcopy(model).float()
    truth = everything(model, batch[torch.float64])
    own32 = everything(e3nn32, batch[torch.float32])  # e3nn's own float32 error is the bound
    fuse_model(model, backend="cueq")
    assert kernel_backend(model) == {"symmetric_contraction": "cueq", "conv": "cueq"}
    for got, want in zip(everything(model, batch[torch.float64]), truth, strict=True):
        assert rel_err(got, want) < 1e-6
    model.float()  # the cuEquivariance modules follow their inputs' dtype
    for got, own, exact in zip(everything(model, batch[torch.float32]), own32, truth,
                               strict=True):
        assert rel_err(got.double(), exact) <= 4 * rel_err(own.double(), exact) + 1e-6


@pytest.mark.slow  # 10-30 s each on 2 cores
def test_a_cuda_device_gets_both_kernels_through_cueq(monkeypatch):
    """The device query says CUDA: the choice alone puts both kernels on cuEquivariance
    (run on its fallback here), and unfusing gives mace-torch's modules back."""
    monkeypatch.setattr(fuse_module, "model_device", lambda model: torch.device("cuda"))
    monkeypatch.setattr(backend_module, "cueq_available", lambda: True)
    model = small_model(hidden="6x0e+6x1o+6x2e")
    batch = batch_dict(atoms((2, 2, 1)))
    expected = everything(model, batch)
    keys = list(model.state_dict())
    fuse_model(model)
    assert kernel_backend(model) == {"symmetric_contraction": "cueq", "conv": "cueq"}
    for block, product in zip(model.interactions, model.products, strict=True):
        assert isinstance(block.conv_tp, ChannelwiseConvCueq) and hasattr(block, "conv_fusion")
        assert isinstance(product.symmetric_contractions, SymmetricContractionCueq)
    assert list(model.state_dict()) == keys
    for got, want in zip(everything(model, batch), expected, strict=True):
        assert rel_err(got, want) < 1e-6
    unfuse_model(model)
    assert all(isinstance(b.conv_tp, o3.TensorProduct) and not hasattr(b, "conv_fusion")
               for b in model.interactions)
    assert all(type(p.symmetric_contractions) is SymmetricContraction for p in model.products)


@pytest.mark.slow  # 10-30 s each on 2 cores
def test_a_cueq_model_pickles_as_mace_torch_modules(tmp_path):
    model = small_model()
    batch = batch_dict(atoms((2, 2, 1)))
    fuse_model(model, backend="cueq")
    expected = everything(model, batch)
    torch.save(model, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    assert isinstance(loaded.interactions[0].conv_tp, ChannelwiseConvCueq)
    for got, want in zip(everything(loaded, batch), expected, strict=True):
        assert rel_err(got, want) < 1e-10
    plain = unfuse_model(loaded)
    for got, want in zip(everything(plain, batch), expected, strict=True):
        assert rel_err(got, want) < 1e-6


@pytest.mark.parametrize("reduced", [False, True])
def test_a_correlation_2_model_in_either_basis(reduced):
    """Its scalar output's U tensor is the same in both CG bases and its vector output's is
    not: the basis is told by every output, not by the first."""
    model = paper_model(torch.float64, reduced_cg=reduced, size="tiny")
    batch = batch_dict(supercell(16), zs=[int(z) for z in model.atomic_numbers])
    truth = everything(model, batch)
    fuse_model(model, backend="cueq")
    for got, want in zip(everything(model, batch), truth, strict=True):
        assert rel_err(got, want) < 1e-6
