"""A fused model pickles (torch.save of the whole model, copy.deepcopy) and loads fused again,
with energies and forces equal to the original's and mace-torch's."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import mace  # noqa: F401  (as mace users do; cfmtrain itself no longer needs it first)
import pytest
import torch
from helpers import atoms, batch_dict, energy_forces_grads, small_model
from mace import modules

from cfmtrain.kernels import fuse_model, kernel_backend, unfuse_model
from cfmtrain.kernels.conv import FusedChannelwiseConv
from cfmtrain.kernels.cueq import SymmetricContractionCueq
from cfmtrain.kernels.symmetric_contraction import SymmetricContractionFused

FUSED = {"symmetric_contraction": "cpu-fused", "conv": "cpu-fused"}


@pytest.fixture(autouse=True)
def one_thread():
    """One thread (a shared 2-core machine); e3nn keeps its default TorchScript compilation,
    whose scripted submodules are what the fused conv could not pickle."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def max_rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) / max(float(y.abs().max()), 1.0)
               for x, y in zip(a, b, strict=True))


def assert_fully_fused(model: torch.nn.Module) -> None:
    assert kernel_backend(model) == FUSED
    assert all(isinstance(b.conv_tp, FusedChannelwiseConv) for b in model.interactions)
    # the radial MLP's last layer stays inside the conv: linked to the block's own MLP object
    assert all(b.conv_tp._radial is b.conv_tp_weights and b.conv_tp_weights.factored
               for b in model.interactions)
    assert all(isinstance(p.symmetric_contractions, SymmetricContractionFused)
               for p in model.products)


@pytest.fixture(scope="module")
def fused_and_batch():
    model = fuse_model(small_model(cls=modules.ScaleShiftMACE, reduced=True))
    return model, batch_dict(atoms())


def test_torch_save_load_gives_the_same_fused_model(fused_and_batch, tmp_path):
    model, batch = fused_and_batch
    path = tmp_path / "fused.model"
    torch.save(model, path)
    loaded = torch.load(path, weights_only=False)
    assert_fully_fused(loaded)
    assert loaded.state_dict().keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    got, expected = energy_forces_grads(loaded, batch), energy_forces_grads(model, batch)
    assert max_rel(got, expected) <= 1e-12
    reference = energy_forces_grads(unfuse_model(copy.deepcopy(model)), batch)
    assert max_rel(got, reference) <= 1e-10
    # the loaded model unfuses to a plain mace-torch model with the same outputs
    assert max_rel(energy_forces_grads(unfuse_model(loaded), batch), reference) <= 1e-12


@pytest.mark.slow
def test_loads_fused_in_a_fresh_interpreter(fused_and_batch, tmp_path):
    """Unpickling imports cfmtrain itself (no mace first) and re-fuses."""
    model, batch = fused_and_batch
    torch.save(model, tmp_path / "fused.model")
    torch.save(batch, tmp_path / "batch.pt")
    code = textwrap.dedent(f"""
        import torch
        model = torch.load({str(tmp_path / "fused.model")!r}, weights_only=False)
        batch = torch.load({str(tmp_path / "batch.pt")!r}, weights_only=True)
        assert type(model.interactions[0].conv_tp).__name__ == "FusedChannelwiseConv"
        assert all(b.conv_tp._radial is b.conv_tp_weights for b in model.interactions)
        assert model.cfmtrain_kernel_backend == {FUSED!r}
        out = model(batch, training=False, compute_force=True)
        torch.save([out["energy"].detach(), out["forces"].detach()],
                   {str(tmp_path / "out.pt")!r})
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd="/", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    out = model(dict(batch), training=False, compute_force=True)
    assert max_rel(got, [out["energy"].detach(), out["forces"].detach()]) <= 1e-12


def test_deepcopy_eval_mode_and_a_dtype_change_survive(fused_and_batch, tmp_path):
    model, batch = fused_and_batch
    copied = copy.deepcopy(model).float().eval()  # .float() gives the convs new buffers
    assert_fully_fused(copied)
    assert not any(p.data_ptr() == q.data_ptr()
                   for p, q in zip(copied.parameters(), model.parameters(), strict=True))
    path = tmp_path / "float32.model"
    torch.save(copied, path)
    loaded = torch.load(path, weights_only=False)
    assert_fully_fused(loaded)
    assert not any(m.training for m in loaded.modules())
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    assert all(b.dtype == torch.float32 for b in loaded.buffers() if b.is_floating_point())
    batch32 = {k: v.float() if v.is_floating_point() else v for k, v in batch.items()}
    got, expected = energy_forces_grads(loaded, batch32), energy_forces_grads(copied, batch32)
    assert max_rel(got, expected) <= 1e-6


@pytest.mark.slow
def test_cueq_backend_pickles():
    pytest.importorskip("cuequivariance_torch")
    model = fuse_model(small_model(cls=modules.ScaleShiftMACE, reduced=True), backend="cueq")
    loaded = copy.deepcopy(model)  # pickling's __reduce__ path, without a file
    assert kernel_backend(loaded) == kernel_backend(model)
    assert all(isinstance(p.symmetric_contractions, SymmetricContractionCueq)
               for p in loaded.products)
    assert loaded.products[0].symmetric_contractions.method == "naive"
    batch = batch_dict(atoms((1, 1, 1)))
    got, expected = energy_forces_grads(loaded, batch), energy_forces_grads(model, batch)
    assert max_rel(got, expected) <= 1e-12
