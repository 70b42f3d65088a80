"""The sweeps on a small real graph store: step times per batch size and capacity measured in
subprocesses with a tiny MACE, out-of-memory recorded as such, the recommendation's rules."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
import pytest
from ase.build import bulk, molecule

from cfmtrain.sweep import capacity, cli

TINY = ["model.hidden_irreps=4x0e+4x1o", "model.max_ell=1", "model.correlation=2",
        "model.radial_mlp=[8]", "model.num_interactions=1"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from cfmtrain.graphs.build import atoms_to_graph
    from cfmtrain.graphs.split import split_indices
    from cfmtrain.graphs.store import GraphStore, write_shard

    root = tmp_path_factory.mktemp("store")
    rng = np.random.default_rng(0)
    frames = []
    for k in range(6):
        water = molecule("H2O")
        water.rattle(0.02, seed=k)
        frames.append((water, "water_clusters"))
        metal = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(3)  # 108 atoms
        metal.rattle(0.05, seed=k)
        frames.append((metal, "cuni"))
    graphs = []
    for index, (atoms, subset) in enumerate(frames):
        atoms.info.update(REF_energy=float(rng.normal()), config_type=subset)
        atoms.arrays["REF_forces"] = rng.normal(size=(len(atoms), 3))
        graphs.append({**atoms_to_graph(atoms, 4.5), "source_index": index})
    write_shard(root / "graphs" / "shard_0000.h5", graphs, cutoff=4.5)
    parts = split_indices(GraphStore(root / "graphs").subsets, (0.2, 0.2), 0)
    np.savez(root / "split.npz", seed=0, **parts)
    return root


def sweep(store, kind: str, *extra: str) -> pd.DataFrame:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    out = store / f"{kind}.csv"
    args = parser.parse_args([kind, "--graphs", str(store / "graphs"), "--split",
                              str(store / "split.npz"), "--output", str(out),
                              *[f"--override={o}" for o in TINY], *extra])
    assert cli.run(args) == 0
    return pd.read_csv(out)


@pytest.mark.slow
def test_batch_sweep_times_every_point(store, monkeypatch):
    monkeypatch.setitem(cli.PRESETS, "quick", {**cli.PRESETS["quick"], "small": [1, 4],
                                               "large": [1], "repeats": 1})
    frame = sweep(store, "batch", "--dtypes", "float32", "float64")
    assert len(frame) == 6 and set(frame.status) == {"ok"}, frame
    assert (frame.step_s > 0).all()
    small = frame[(frame.molecules == "small") & (frame.dtype == "float32")]
    assert small.atoms.tolist() == [3, 12]
    assert set(frame[frame.molecules == "large"].atoms) == {108}


@pytest.mark.slow
def test_out_of_memory_is_recorded(store, monkeypatch):
    monkeypatch.setitem(cli.PRESETS, "quick", {**cli.PRESETS["quick"], "small": [1],
                                               "large": [64, 128], "repeats": 1})
    frame = sweep(store, "batch", "--dtypes", "float64", "--memory-budget-mb", "30")
    small = frame[frame.molecules == "small"].iloc[0]
    assert small.status == "ok" and small.step_s > 0 and small.atoms == 3, frame.to_string()
    large = frame[frame.molecules == "large"]
    assert large.status.tolist() == ["oom", "skipped"], frame.to_string()
    assert "memory" in str(large.error.iloc[0]).lower() or "alloc" in str(large.error.iloc[0])


def test_recommendation_rules():
    frame = pd.DataFrame({"dtype": "float32", "capacity": [64, 128, 256, 512, 1024],
                          "atoms_per_s": [50.0, 80.0, 95.0, 100.0, np.nan],
                          "status": ["ok", "ok", "ok", "ok", "oom"]})
    rec = capacity.recommend(frame, largest_graph=100, dtype="float32", tolerance=0.1)
    assert rec["recommended_capacity"] == 256 and rec["memory_upper_bound"] == 1023
    rec = capacity.recommend(frame, largest_graph=300, dtype="float32")
    assert rec["recommended_capacity"] == 512
    assert capacity.fill_bin(np.array([5, 3, 4]), np.array([0, 1, 2]), 8) == [0, 1]
    with pytest.raises(ValueError, match="smaller than every graph"):
        capacity.fill_bin(np.array([5]), np.array([0]), 4)


@pytest.mark.slow
def test_capacity_sweep_and_recommendation(store, monkeypatch):
    monkeypatch.setitem(cli.PRESETS, "quick", {**cli.PRESETS["quick"], "capacities": [108, 216],
                                               "repeats": 1})
    rec = store / "capacity.json"
    frame = sweep(store, "capacity", "--dtypes", "float32", "--recommendation", str(rec))
    assert frame.status.tolist() == ["ok", "ok"], frame.to_string()
    assert (frame.atoms <= frame.capacity).all() and (frame.atoms_per_s > 0).all()
    data = json.loads(rec.read_text())
    assert data["recommended_capacity"] in (108, 216) and data["lower_bound"] == 108
    assert (store / "capacity.md").read_text().startswith("# Recommended bin capacity")


def test_calibration_batches_vary_atoms_and_edges_apart():
    from cfmtrain.sweep.calibrate import calibration_batches

    rng = np.random.default_rng(0)
    atoms = rng.integers(3, 120, 400)
    density = np.where(np.arange(400) % 2 == 0, 8.0, 40.0)  # half sparse, half dense graphs
    edges = np.rint(atoms * density).astype(np.int64)
    train = np.arange(0, 400, 1)
    batches, labels = calibration_batches(atoms, edges, train, [64, 512, 2048], seed=1)
    frame = pd.DataFrame(labels)
    assert frame.pool.tolist() == ["sparse"] * 3 + ["dense"] * 3
    for batch, label in zip(batches, labels, strict=True):
        assert label["atoms"] == atoms[batch].sum() <= label["target_atoms"]
        assert label["atoms"] >= 0.9 * label["target_atoms"]  # filled, not a token batch
        assert label["edges"] == edges[batch].sum() and len(set(batch)) == len(batch)
        want = 8.0 if label["pool"] == "sparse" else 40.0
        assert np.all(density[batch] == want)
    assert set(np.concatenate(batches)) <= set(train)
    with pytest.raises(ValueError, match="only 2 batches"):
        calibration_batches(atoms, edges, train, [64], seed=1)


@pytest.mark.slow
def test_calibration_times_both_compute_paths(store):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    out = store / "calibration.csv"
    tiny = [f"--set={o}" for o in TINY]
    args = parser.parse_args(["calibrate", "--graphs", str(store / "graphs"), "--split",
                              str(store / "split.npz"), "--output", str(out), *tiny,
                              "--set", "threads=1"])
    preset = {**cli.PRESETS["quick"], "calibration": [3, 108, 216], "calibration_repeats": 2}
    cli.PRESETS["quick"], saved = preset, cli.PRESETS["quick"]
    try:
        assert cli.run(args) == 0
    finally:
        cli.PRESETS["quick"] = saved
    frame = pd.read_csv(out)
    assert set(frame.status) == {"ok"}, frame.to_string()
    assert frame.groupby("kernels").variant.first().to_dict() == {"fused": "kernel",
                                                                 "mace": "baseline"}
    assert (frame.step_min_s <= frame.step_s).all() and (frame.step_s <= frame.step_max_s).all()
    assert (frame.repeats >= 2).all() and (frame.step_s > 0).all()
    assert set(frame.pool) == {"sparse", "dense"}
    with pytest.raises(SystemExit, match="not --override/--dtypes"):
        cli.run(parser.parse_args(["calibrate", "--graphs", str(store / "graphs"), "--split",
                                   str(store / "split.npz"), "--output", str(out),
                                   "--dtypes", "float64"]))


@pytest.mark.slow
def test_calibration_fails_when_a_path_times_nothing(store):
    from cfmtrain.graphs.store import GraphStore
    from cfmtrain.sweep.calibrate import calibration_sweep

    train = np.arange(len(GraphStore(store / "graphs")))
    with pytest.raises(RuntimeError, match="calibration of the mace path .baseline.: no batch "
                                           "was timed; first: error"):
        calibration_sweep(GraphStore(store / "graphs"), str(store / "split.npz"), train,
                          [3, 108, 216], ["model.no_such_key=1"], 1, 1)
