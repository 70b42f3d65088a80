"""The crystals preset of `cfmtrain generate`: Morse labels against ASE's MorsePotential and
finite differences, MPtrj-like statistics, and frames independent of shards and workers."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
import yaml
from ase import Atoms
from ase.build import bulk
from ase.calculators.morse import MorsePotential
from helpers import REPO

from cfmtrain.frames.extxyz import iter_extxyz
from cfmtrain.frames.neighbors import radius_graph
from cfmtrain.sources import crystals


def test_single_element_labels_equal_ase_morse():
    atoms = bulk("Cu", "fcc", a=3.6).repeat((3, 3, 3))
    atoms.rattle(0.05, seed=1)
    energy, forces, stress = crystals.morse_labels(atoms)
    r0, eps = (float(v[0]) for v in crystals.morse_parameters(atoms.numbers[:1]))
    atoms.calc = MorsePotential(epsilon=eps, r0=r0, rho0=crystals.RHO0,
                                rcut1=crystals.INNER / r0, rcut2=crystals.OUTER / r0)
    assert energy == pytest.approx(atoms.get_potential_energy(), rel=1e-12)
    np.testing.assert_allclose(forces, atoms.get_forces(), atol=1e-12)
    np.testing.assert_allclose(stress, atoms.get_stress(voigt=False), atol=1e-12)


def _energy(atoms: Atoms) -> float:
    return crystals.morse_labels(atoms)[0]


def test_mixed_labels_are_derivatives_of_the_energy():
    atoms = crystals.crystal(np.random.default_rng([7, 3]))
    while len(set(atoms.numbers)) < 2:
        atoms = crystals.crystal(np.random.default_rng([7, len(atoms)]))
    _, forces, stress = crystals.morse_labels(atoms)
    h = 1e-5
    for i in range(min(4, len(atoms))):
        for k in range(3):
            plus, minus = atoms.copy(), atoms.copy()
            plus.positions[i, k] += h
            minus.positions[i, k] -= h
            assert -(_energy(plus) - _energy(minus)) / (2 * h) == pytest.approx(
                forces[i, k], abs=1e-6)
    for a, b in ((0, 0), (1, 2)):
        strains = []
        for sign in (1, -1):
            strained = atoms.copy()
            eps = np.eye(3)
            eps[a, b] += sign * h / (2 if a != b else 1)
            eps[b, a] += sign * h / 2 if a != b else 0
            strained.set_cell(atoms.cell.array @ eps, scale_atoms=True)
            strains.append(_energy(strained))
        assert (strains[0] - strains[1]) / (2 * h) / atoms.get_volume() == pytest.approx(
            stress[a, b], abs=1e-6)


@pytest.mark.slow
def test_statistics_are_mptrj_like():
    frames = [crystals.make_frame(0, i) for i in range(2000)]
    sizes = np.array([len(f) for f in frames])
    assert sizes.min() >= 1 and sizes.max() <= 444
    assert 17 <= np.median(sizes) <= 24 and 26 <= sizes.mean() <= 36
    assert len({int(z) for f in frames for z in f.numbers}) >= 30
    edges = [radius_graph(f.positions, f.cell.array, f.pbc, 4.5).edge_index.shape[1]
             for f in frames[:300]]
    assert 600 <= np.mean(edges) <= 1400
    for f in frames:
        assert np.isfinite(f.info["REF_energy"]) and np.isfinite(f.arrays["REF_forces"]).all()
        assert np.isfinite(f.info["REF_stress"]).all()


def _frames(folder):
    out = []
    for path in sorted(folder.glob("frames_*.extxyz")):
        with open(path) as fh:
            out += [atoms for _, atoms, _ in iter_extxyz(fh, str(path))]
    return out


@pytest.mark.slow
def test_frames_do_not_depend_on_shards_or_workers(tmp_path):
    one = crystals.generate_crystals(tmp_path / "one", 60, seed=3, num_shards=1, workers=1)
    three = crystals.generate_crystals(tmp_path / "three", 60, seed=3, num_shards=3, workers=2)
    assert [s["frames"] for s in three["shards"]] == [20, 20, 20]
    assert one["total_frames"] == three["total_frames"] == 60
    a, b = _frames(tmp_path / "one"), _frames(tmp_path / "three")
    assert len(a) == len(b) == 60
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.positions, y.positions)
        assert x.info["REF_energy"] == y.info["REF_energy"]
    other = crystals.generate_crystals(tmp_path / "other", 60, seed=4, num_shards=1)
    assert other["shards"][0]["sha256"] != one["shards"][0]["sha256"]


@pytest.mark.slow
def test_generate_command_needs_graphs_for_crystals(tmp_path):
    def generate(*words):
        return subprocess.run([sys.executable, "-m", "cfmtrain", "generate", "--output-dir",
                               str(tmp_path / "f"), *words], capture_output=True, text=True)

    missing = generate("--preset", "crystals")
    assert missing.returncode == 2 and "needs --graphs" in missing.stderr
    empty = generate("--preset", "crystals", "--graphs", "2", "--num-shards", "3")
    assert empty.returncode == 2 and "a shard would be empty" in empty.stderr
    mini = generate("--graphs", "5")
    assert mini.returncode == 2 and "--scale" in mini.stderr
    ok = generate("--preset", "crystals", "--graphs", "4", "--num-shards", "2")
    assert ok.returncode == 0, ok.stderr
    assert len(_frames(tmp_path / "f")) == 4


SCALE_PAGE = REPO / "docs" / "scale.md"


@pytest.mark.slow
def test_the_pages_generate_line_runs_as_written(tmp_path):
    blocks = re.findall(r"```bash\n(.*?)```", SCALE_PAGE.read_text(), re.S)
    [line] = [c for b in blocks for c in b.splitlines() if c.startswith("cfmtrain generate")]
    out = subprocess.run([sys.executable, "-m", "cfmtrain", *shlex.split(line)[1:]],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert len(_frames(tmp_path / "results/data/crystals/frames")) == 1000


@pytest.mark.workflow
def test_the_pages_data_set_plans_its_frames_and_graphs(tmp_path):
    [block] = re.findall(r"```yaml\n(.*?)```", SCALE_PAGE.read_text(), re.S)
    config = {**yaml.safe_load((REPO / "config/config.yaml").read_text()),
              **yaml.safe_load(block)}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    out = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "graphs",
                          "--configfile", str(tmp_path / "c.yaml")], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "generate --preset crystals --output-dir results/data/crystals_1m/frames " \
        "--num-shards 50 --graphs 1000000" in out.stdout
    assert out.stdout.count("rule graph_shard:") == 50
