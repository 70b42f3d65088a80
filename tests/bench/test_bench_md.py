"""`cfmtrain bench md`: its systems (sizes, composition, density, geometry), its MP-0-shaped
models (fused equal to mace-torch through MACECalculator), and the bench end to end on a tiny
shape (rows, speed-ups and ns/day computed from the run's own timings, the figure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from ase.neighborlist import neighbor_list

from cfmtrain.bench.md_worker import build_shape, fcc_alloy, water_box


@pytest.mark.parametrize("target", [1000, 5000, 20000])
def test_systems_have_about_the_asked_size(target):
    for atoms in (fcc_alloy(target), water_box(target)):
        assert abs(len(atoms) - target) <= 0.05 * target
        assert atoms.pbc.all() and atoms.get_volume() > 0


def test_fcc_alloy_is_a_fifth_nickel_and_rattled():
    atoms = fcc_alloy(1000)
    assert set(atoms.numbers) == {28, 29}
    assert 0.15 < (atoms.numbers == 28).mean() < 0.25
    i, j, d = neighbor_list("ijd", atoms, 2.8)  # fcc nearest neighbours at 3.61/sqrt(2) = 2.55
    assert np.bincount(i, minlength=len(atoms)).mean() == pytest.approx(12, abs=0.5)
    assert 2.3 < d.min() < 2.55 < d.max()


def test_water_box_is_whole_molecules_at_one_gram_per_cm3():
    atoms = water_box(1000)
    assert list(atoms.numbers[:6]) == [8, 1, 1, 8, 1, 1]
    grams = atoms.get_masses().sum() / 6.02214076e23
    assert grams / (atoms.get_volume() * 1e-24) == pytest.approx(1.0, rel=1e-9)
    i, j, d = neighbor_list("ijd", atoms, 2.0)
    molecule = np.arange(len(atoms)) // 3
    same = molecule[i] == molecule[j]
    bonds = d[same & ((atoms.numbers[i] == 8) | (atoms.numbers[j] == 8))]
    assert np.allclose(bonds, 0.969, atol=0.01)  # O-H of ase.build.molecule("H2O")
    assert d[~same].min() > 1.0  # no two molecules overlap
    orientations = (atoms.positions[1::3] - atoms.positions[0::3])
    assert orientations.std(axis=0).min() > 0.4  # randomly oriented, not one copy


@pytest.mark.slow
@pytest.mark.parametrize("shape, hidden", [("mp0-small", "128x0e"),
                                           ("mp0-medium", "128x0e+128x1o")])
def test_mp0_shapes_fuse_to_mace_torch_energy_and_forces(shape, hidden):
    from mace.calculators import MACECalculator

    from cfmtrain.kernels import fuse_model, kernel_backend

    model = build_shape(shape, torch.float64)
    assert float(model.r_max) == 6.0 and len(model.atomic_numbers) == 89
    assert str(model.products[0].linear.irreps_out) == hidden
    assert model.interactions[0].conv_tp_weights.hs == [10, 64, 64, 64,
                                                        model.interactions[0].conv_tp.weight_numel]
    atoms = fcc_alloy(32)
    atoms.calc = MACECalculator(models=[build_shape(shape, torch.float64)], device="cpu",
                                default_dtype="float64")
    reference = atoms.get_potential_energy(), atoms.get_forces()
    fuse_model(model)
    assert set(kernel_backend(model).values()) == {"cpu-fused"}
    atoms.calc = MACECalculator(models=[model], device="cpu", default_dtype="float64")
    # 2e-8, not 1e-12: in two full-suite CI runs on fresh machines (2026-11-26) mace-torch's own
    # float64 reference came out off its value in isolation (energy 6.8e-10 relative, forces 2.2e-9
    # of the largest force), while the fused values equalled the isolated reference bit for bit;
    # in isolation, with 1 or 2 threads, it is reproducible to 6e-18. The cause on mace-torch's
    # side is not found. 2e-8 still fails a float32 path: this model fused in float32 is 4.9e-7
    # (energy) and 1.9e-6 (forces) off the float64 reference (measured 2026-11-27).
    assert atoms.get_potential_energy() == pytest.approx(reference[0], rel=2e-8)
    assert np.abs(atoms.get_forces() - reference[1]).max() <= 2e-8 * np.abs(reference[1]).max()
    assert np.abs(reference[1]).max() > 1e-4  # a model that exerts forces


@pytest.mark.slow
def test_bench_md_end_to_end(tmp_path):
    csv, png = tmp_path / "md.csv", tmp_path / "md.png"
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY")}
    subprocess.run([sys.executable, "-m", "cfmtrain", "bench", "md", "--preset", "test",
                    "--systems", "fcc", "water", "--threads", "1", "--output", str(csv),
                    "--figure", str(png)], check=True, env=env)
    rows = pd.read_csv(csv)
    assert len(rows) == 4 and (rows.status == "ok").all()
    assert set(zip(rows.system, rows.impl, strict=True)) == {(s, i) for s in ("fcc", "water")
                                                for i in ("fused", "mace")}
    assert (rows.backend == rows.impl.map({"fused": "cpu-fused", "mace": "mace"})).all()
    for _, group in rows.groupby("system"):
        mace, fused = (group[group.impl == i].iloc[0] for i in ("mace", "fused"))
        assert fused.atoms == mace.atoms and abs(fused.atoms - 100) <= 30
        assert fused.speedup_vs_mace == pytest.approx(mace.median_step_s / fused.median_step_s)
        assert mace.speedup_vs_mace == 1.0
        # paired rounds of one MD step, both models in one process: on the fused row
        assert fused.rounds == 2 and np.isnan(mace.ratio_median)
        assert 0 < fused.ratio_p10 <= fused.ratio_median <= fused.ratio_p90
        assert fused.ratio_median != 1.0  # times, not ASE's run() flags (all 1.0)
        assert fused.energy_rel_diff_vs_mace <= 1e-5 and fused.forces_rel_diff_vs_mace <= 1e-4
    assert np.allclose(rows.ns_per_day, 86400 / rows.median_step_s * 1e-6)
    assert np.allclose(rows.steps_per_s, 1 / rows.median_step_s)
    assert np.allclose(rows.us_per_atom, rows.median_step_s / rows.atoms * 1e6)
    assert (rows.setup_s > 0).all() and rows.convert_s.isna().all()  # no converter
    assert (rows.min_step_s <= rows.median_step_s).all()
    assert (rows.median_step_s <= rows.max_step_s).all()
    assert (rows.steps == 3).all() and (rows.threads == 1).all()
    # the children's defaults: passive OpenMP waits, one OpenBLAS thread (numpy's)
    assert (rows.omp_wait_policy == "passive").all() and (rows.openblas_threads == 1).all()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_failing_configuration_is_a_row_not_a_crash():
    """In a child, as the bench runs it (a configuration sets process-wide torch state)."""
    bad = {"system": "fcc", "shape": "tiny", "atoms": 8, "impl": "fused", "steps": 3,
           "dtype": "float16", "threads": 1}
    done = subprocess.run([sys.executable, "-m", "cfmtrain.bench.md", json.dumps(bad)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["status"].startswith("error: ")


@pytest.mark.slow
@pytest.mark.parametrize("caller", [None, "2"])
def test_children_get_one_openblas_thread_unless_the_caller_sets_it(monkeypatch, caller):
    from cfmtrain.bench.kernels import memory_limit, run_child

    if caller is None:
        monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", caller)
    bad = {"system": "fcc", "shape": "tiny", "atoms": 8, "impl": "fused", "steps": 3,
           "dtype": "float16", "threads": 1}
    row = run_child(bad, 300, memory_limit(None), module="cfmtrain.bench.md")
    assert row["status"].startswith("error: ")
    assert row["openblas_threads"] == (caller or "1")


def test_steps_below_three_are_refused():
    import argparse

    from cfmtrain.bench import md

    parser = argparse.ArgumentParser()
    md.add_arguments(parser)
    with pytest.raises(ValueError, match="at least 3"):
        md.configs(parser.parse_args(["--preset", "test", "--steps", "2"]))
