"""fuse_model / unfuse_model on whole mace-torch models: parameters and state_dict unchanged,
energies, forces and energy+forces parameter gradients equal to mace-torch's, MACECalculator."""

from __future__ import annotations

import copy
import warnings

import ase.build
import ase.units
import mace  # noqa: F401  (import mace before e3nn)
import numpy as np
import pytest
import torch
from e3nn import o3
from helpers import (  # noqa: F401  (small_and_serial: autouse, one thread, no e3nn TorchScript)
    Z,
    atoms,
    batch_dict,
    energy_forces_grads,
    rel_err,
    small_and_serial,
    small_model,
)
from mace import modules
from mace.calculators import MACECalculator
from mace.modules.symmetric_contraction import SymmetricContraction

from cfmtrain.kernels import backend as kernel_backend_module
from cfmtrain.kernels import choose_backend, fuse_model, kernel_backend, unfuse_model
from cfmtrain.kernels.backend import choose_conv_backend
from cfmtrain.kernels.symmetric_contraction import SymmetricContractionFused


def l2_err(a, b):
    norm = b.norm().item()
    return (a.double() - b).norm().item() / (norm if norm > 0 else 1.0)


CASES = [
    (modules.MACE, False, "8x0e+8x1o", 2),
    (modules.ScaleShiftMACE, True, "8x0e+8x1o", 3),
    (modules.MACE, True, "6x0e+6x1o+6x2e", 2),
]


@pytest.mark.parametrize("case", CASES, ids=["mace", "scaleshift-reduced-l3", "hidden-2e"])
def test_fused_model_matches_mace_float64(case):
    cls, reduced, hidden, max_ell = case
    model = small_model(cls, reduced, hidden, max_ell)
    batch = batch_dict(atoms())
    expected = energy_forces_grads(model, batch)
    fuse_model(model, conv=False)
    assert all(isinstance(p.symmetric_contractions, SymmetricContractionFused)
               for p in model.products)
    got = energy_forces_grads(model, batch)
    for g, e in zip(got, expected, strict=True):
        # the lone atom's forces, and gradients through them, vanish by symmetry: what remains
        # (1e-40 here) is rounding, compared against an absolute floor far below any real value
        assert (g - e).abs().max().item() <= 1e-10 * max(e.abs().max().item(), 1e-12)


def test_fuse_keeps_parameters_and_state_dict_and_unfuse_restores():
    model = small_model()
    originals = [p.symmetric_contractions for p in model.products]
    params_before = {name: p for name, p in model.named_parameters()}
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    assert fuse_model(model, conv=False) is model
    assert kernel_backend(model) == {"symmetric_contraction": "cpu-fused", "conv": "mace"}
    assert list(model.state_dict()) == list(state_before)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state_before[key])
    for name, p in model.named_parameters():
        assert p is params_before[name]
    fuse_model(model, conv=False)  # idempotent
    assert unfuse_model(model) is model
    for product, original in zip(model.products, originals, strict=True):
        assert product.symmetric_contractions is original
        assert type(original) is SymmetricContraction
    assert kernel_backend(model) == {}
    assert list(model.state_dict()) == list(state_before)


def test_fused_model_trains_the_shared_parameters():
    model = fuse_model(small_model(), conv=False)
    batch = batch_dict(atoms())
    weight = model.products[0].symmetric_contractions.contractions[0].weights_max
    before = weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    out = model(dict(batch), training=True, compute_force=True)
    (out["energy"].pow(2).sum() + out["forces"].pow(2).sum()).backward()
    optimizer.step()
    assert not torch.equal(weight, before)
    unfuse_model(model)
    assert model.products[0].symmetric_contractions.contractions[0].weights_max is weight


def test_float32_whole_model_within_twice_mace_error():
    model64 = small_model(reduced=True)
    batch = batch_dict(atoms())
    exact = energy_forces_grads(model64, batch)
    mace32 = energy_forces_grads(copy.deepcopy(model64).float(), batch_dict(atoms(), torch.float32))
    fused = fuse_model(copy.deepcopy(model64).float(), conv=False)
    ours32 = energy_forces_grads(fused, batch_dict(atoms(), torch.float32))
    rounding = 4 * torch.finfo(torch.float32).eps  # a float32 sum's own rounding, in any order
    for ours, theirs, e in zip(ours32, mace32, exact, strict=True):
        assert ours.dtype == torch.float32
        assert l2_err(ours, e) <= 2 * l2_err(theirs, e) + rounding


def md_trajectory(calc, steps=15):
    """Positions, energy, forces and stress at every step of float64 VelocityVerlet MD."""
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet

    structure = atoms((2, 2, 1))
    MaxwellBoltzmannDistribution(structure, temperature_K=600, rng=np.random.default_rng(3))
    structure.calc = calc
    frames = []

    def record():
        frames.append([structure.get_positions(), np.array(structure.get_potential_energy()),
                       structure.get_forces(), structure.get_stress()])

    dyn = VelocityVerlet(structure, timestep=2.0 * ase.units.fs)
    dyn.attach(record, interval=1)
    dyn.run(steps)
    return frames


@pytest.mark.slow
def test_fully_fused_model_runs_md_in_mace_calculator(tmp_path):
    path = tmp_path / "small.model"
    torch.save(small_model(reduced=True), path)  # as mace users save and share models
    reference = MACECalculator(model_paths=str(path), device="cpu", default_dtype="float64")
    fused = MACECalculator(model_paths=str(path), device="cpu", default_dtype="float64")
    for model in fused.models:
        fuse_model(model)
        assert kernel_backend(model) == {"symmetric_contraction": "cpu-fused", "conv": "cpu-fused"}
    got, expected = md_trajectory(fused), md_trajectory(reference)
    assert len(got) == len(expected) == 16
    assert np.abs(expected[-1][0] - expected[0][0]).max() > 0.05  # the atoms really moved
    for step, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        for name, a, b in zip(("positions", "energy", "forces", "stress"), ours, theirs,
                              strict=True):
            assert np.abs(a - b).max() <= 1e-10 * max(np.abs(b).max(), 1.0), (step, name)


def test_one_atom_and_one_element():
    model = fuse_model(small_model(), conv=False)
    reference = unfuse_model(copy.deepcopy(model))
    single = ase.Atoms("Cu", positions=[[0, 0, 0]], cell=[2.6, 2.6, 2.6], pbc=True)
    batch = batch_dict(single)  # one atom, one element, its periodic images as neighbours
    got, expected = energy_forces_grads(model, batch), energy_forces_grads(reference, batch)
    for g, e in zip(got, expected, strict=True):
        # the lone atom's forces, and gradients through them, vanish by symmetry: what remains
        # (1e-40 here) is rounding, compared against an absolute floor far below any real value
        assert (g - e).abs().max().item() <= 1e-10 * max(e.abs().max().item(), 1e-12)


@pytest.mark.slow
def test_cueq_backend_shares_parameters_and_matches_mace():
    # the CUDA backend, run here through cuequivariance's PyTorch ("naive") method on the CPU
    model = small_model(reduced=True)
    batch = batch_dict(atoms((2, 2, 1)))
    expected = energy_forces_grads(model, batch)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fuse_model(model, backend="cueq")
    assert kernel_backend(model) == {"symmetric_contraction": "cueq", "conv": "cueq"}
    assert list(model.state_dict()) == list(state)
    for g, e in zip(energy_forces_grads(model, batch), expected, strict=True):
        # cuet's basis reaches mace's reduced one by a least-squares projection rounded to
        # sqrt-rationals, which mace checks only to 1e-7 (cg_cueq_tools); measured here: 3e-8
        assert rel_err(g, e) < 1e-6
    fuse_model(model, conv=False)  # cueq -> cpu-fused -> reference, then mace-torch's modules
    assert model.products[0].symmetric_contractions.backend == "cpu-fused"
    fuse_model(model, backend="reference")
    assert isinstance(model.products[0].symmetric_contractions, SymmetricContractionFused)
    assert model.products[0].symmetric_contractions.backend == "reference"
    unfuse_model(model)
    assert type(model.products[0].symmetric_contractions) is SymmetricContraction


def test_backend_choice_warns_once_and_records(monkeypatch):
    assert choose_backend("cpu") == "cpu-fused"
    monkeypatch.setattr(kernel_backend_module, "_warned", set())
    with pytest.warns(UserWarning, match="mace-torch's own"):
        assert choose_backend("meta") == "mace"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choose_backend("meta") == "mace"  # warned once only
    monkeypatch.setattr(kernel_backend_module, "cueq_available", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # both kernels on cuEquivariance: nothing to warn about
        assert choose_backend("cuda") == "cueq"
    monkeypatch.setattr(kernel_backend_module, "cueq_available", lambda: False)
    with pytest.warns(UserWarning, match="not installed"):
        assert choose_backend("cuda") == "mace"


def cueq_conv_model():
    """A small mace model whose convs mace-torch built with cuEquivariance (runs on the CPU)."""
    from mace.modules.wrapper_ops import CuEquivarianceConfig

    cueq = CuEquivarianceConfig(enabled=True, layout="mul_ir", group="O3_e3nn",
                                optimize_channelwise=True)
    blocks = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
    return modules.MACE(
        r_max=4.5, num_bessel=4, num_polynomial_cutoff=5, max_ell=1, interaction_cls=blocks,
        interaction_cls_first=blocks, num_interactions=1, num_elements=2,
        hidden_irreps=o3.Irreps("2x0e"), MLP_irreps=o3.Irreps("2x0e"),
        atomic_energies=np.array([-1.0, -2.0]), avg_num_neighbors=8.0, atomic_numbers=Z,
        correlation=1, gate=torch.nn.functional.silu, cueq_config=cueq)


def test_conv_backend_choice_warns_once_and_records(monkeypatch):
    from cfmtrain.kernels import fuse as fuse_module

    monkeypatch.setattr(kernel_backend_module, "_warned", set())
    e3nn_model, cueq_model = small_model(), cueq_conv_model()
    assert choose_conv_backend("cpu", e3nn_model) == "cpu-fused"
    with pytest.warns(UserWarning, match="own .e3nn. conv"):
        assert choose_conv_backend("cuda", e3nn_model) == "mace"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choose_conv_backend("cuda", e3nn_model) == "mace"  # warned once only
    with pytest.warns(UserWarning, match="cuEquivariance conv"):
        assert choose_conv_backend("cuda", cueq_model) == "cueq"
    # fuse_model on a CUDA model (no CUDA here: its device is stubbed) records both kernels
    monkeypatch.setattr(fuse_module, "model_device", lambda model: torch.device("cuda"))
    monkeypatch.setattr(kernel_backend_module, "cueq_available", lambda: False)
    monkeypatch.setattr(kernel_backend_module, "_warned", set())
    with pytest.warns(UserWarning) as caught:
        fuse_model(cueq_model)
    assert kernel_backend(cueq_model) == {"symmetric_contraction": "mace", "conv": "cueq"}
    with pytest.warns(UserWarning, match="own .e3nn. conv"):
        fuse_model(e3nn_model)
    assert kernel_backend(e3nn_model) == {"symmetric_contraction": "mace", "conv": "mace"}
    assert type(e3nn_model.products[0].symmetric_contractions) is SymmetricContraction
    assert len(caught) == 2  # the symmetric contraction's warning, then the conv's
