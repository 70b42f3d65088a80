"""The training loader: batches assembled from the store's arrays equal mace-torch's Collater over
GraphDataset items (periodic, mixed-pbc and molecular graphs, a union of stores over several
shards, weights and padding copies, stress on and off, in memory and read from disk); prefetch
by a thread or worker processes; `cfmtrain bench loader` on a tiny store."""

from __future__ import annotations

import argparse
import threading
import time

import h5py
import mace  # noqa: F401  (mace before e3nn)
import numpy as np
import pandas as pd
import pytest
import torch
from ase.build import fcc111
from ase.calculators.emt import EMT
from helpers import CUTOFF, emt_frames
from mace.tools import AtomicNumberTable
from mace.tools.torch_geometric.dataloader import Collater

from cfmtrain.batches.batching import BatchAssembler
from cfmtrain.batches.cells import edge_shifts
from cfmtrain.batches.data import GraphDataset, make_loader
from cfmtrain.batches.prefetch import THREAD, resolve_workers
from cfmtrain.batches.store_arrays import StoreArrays, store_arrays
from cfmtrain.bench import loader as bench
from cfmtrain.graphs.build import atoms_to_graph
from cfmtrain.graphs.store import GraphStore, write_shard
from cfmtrain.sources.mini import make_frame

Z_TABLE = AtomicNumberTable([1, 8, 28, 29])


def slab():
    """A Cu(111) slab: periodic in x and y only, with stress."""
    atoms = fcc111("Cu", (2, 2, 3), vacuum=4.0)
    atoms.rattle(0.05, seed=3)
    atoms.calc = EMT()
    atoms.info["REF_energy"] = atoms.get_potential_energy()
    atoms.arrays["REF_forces"] = atoms.get_forces()
    atoms.info["REF_stress"] = atoms.get_stress(voigt=False)
    atoms.calc = None
    return atoms


def write(folder, shards):
    folder.mkdir(parents=True)
    for k, frames in enumerate(shards):
        graphs = [{**atoms_to_graph(a, CUTOFF), "source_index": i} for i, a in enumerate(frames)]
        write_shard(folder / f"shard_{k:04d}.h5", graphs, cutoff=CUTOFF)


@pytest.fixture(scope="module")
def union(tmp_path_factory):
    """Two stores as one: a shard of EMT crystals, clusters and water clusters, and two shards
    of other crystals and a slab (with int16 unit shifts)."""
    root = tmp_path_factory.mktemp("union")
    water = [make_frame(0, "water_clusters", i) for i in range(3)]
    write(root / "a", [emt_frames(9, seed=0) + water])
    write(root / "b", [emt_frames(4, seed=1), [slab(), *emt_frames(3, seed=2)]])
    with h5py.File(root / "b" / "shard_0001.h5", "r+") as f:  # shifts wider than int8
        shifts = f["unit_shifts"][...]
        del f["unit_shifts"]
        f.create_dataset("unit_shifts", data=shifts.astype(np.int16))
    return GraphStore([root / "a", root / "b"])


BATCHES = [
    [0, 5, 13, 2],  # both stores, several shards
    [(3, 1.0), (17, 1.0), (3, 0.0), (9, 0.0)],  # a padding copy of a graph in the same batch
    [16], [(12, 1.0)],  # the slab; a water cluster
    list(range(20)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("slice_rows", [0, 10**9])  # rows taken by slices / by a gather
def test_batches_equal_collater_over_graph_dataset(union, dtype, slice_rows, monkeypatch):
    monkeypatch.setattr("cfmtrain.batches.store_arrays.SLICE_ROWS", slice_rows)
    assert len(union.files) == 3 and len(union) == 20
    order = np.random.default_rng(0).permutation(len(union))
    for stress in (True, False):
        dataset = GraphDataset(union, order, Z_TABLE, CUTOFF, dtype, use_stress=stress)
        for budget in (2**40, 0):
            arrays = StoreArrays(union, budget)
            assert arrays.in_memory == bool(budget)
            assemble = BatchAssembler(dataset, arrays)
            for items in BATCHES:
                ours, ref = assemble(items), Collater([None], [None])([dataset[i] for i in items])
                assert bench.batch_differences(ours, ref) == [], (stress, budget, items)
                assert ours.num_graphs == ref.num_graphs and ours.num_nodes == ref.num_nodes
            assert ours.stress_weight.any() == stress


def test_batch_differences_sees_a_changed_value(union):
    dataset = GraphDataset(union, np.arange(len(union)), Z_TABLE, CUTOFF, torch.float32)
    ours = BatchAssembler(dataset, StoreArrays(union, 0))([0, 1])
    ref = Collater([None], [None])([dataset[0], dataset[1]])
    ours.shifts[-1, 0] += 1e-3
    assert bench.batch_differences(ours, ref) == ["shifts"]


def test_edge_shifts_are_unit_shifts_times_cell():
    rng = np.random.default_rng(1)
    cells = torch.as_tensor(rng.normal(size=(4, 3, 3)) + 5 * np.eye(3))
    unit = torch.as_tensor(rng.integers(-3, 4, size=(50, 3)), dtype=torch.float64)
    graph = torch.as_tensor(rng.integers(0, 4, size=50))
    expected = torch.stack([unit[e] @ cells[graph[e]] for e in range(50)])
    torch.testing.assert_close(edge_shifts(unit, cells, graph), expected, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_unit_shifts_give_mace_torchs_shifts_bit_for_bit(tmp_path, dtype):
    """Cells much smaller than the cutoff (unit shifts up to +-5) in skewed, rattled cells: the
    op's shifts (three products summed in order, never a fused multiply-add) equal
    GraphDataset's, whose products are not exact when |unit shift| > 2."""
    from ase import Atoms

    frames = []
    for seed, a in enumerate((1.0, 1.3, 2.2)):
        rng = np.random.default_rng(seed)
        cell = a * (np.eye(3) + 0.15 * rng.normal(size=(3, 3)))
        atoms = Atoms("Cu", positions=[[0.1, 0.2, 0.3]], cell=cell, pbc=True)
        atoms.info["REF_energy"] = -1.0 - seed
        atoms.arrays["REF_forces"] = np.zeros((1, 3))
        frames.append(atoms)
    write(tmp_path / "tiny", [frames])
    store = GraphStore(tmp_path / "tiny")
    with h5py.File(store.files[0]) as f:
        assert np.abs(f["unit_shifts"][...]).max() >= 4
    dataset = GraphDataset(store, np.arange(3), Z_TABLE, CUTOFF, dtype)
    ours = BatchAssembler(dataset, StoreArrays(store, 2**40))([2, 0, 1])
    ref = Collater([None], [None])([dataset[i] for i in (2, 0, 1)])
    assert bench.batch_differences(ours, ref) == []
    assert torch.equal(ours.shifts, ref.shifts)


def test_unknown_element_is_named(union):
    dataset = GraphDataset(union, np.arange(len(union)), AtomicNumberTable([28, 29]), CUTOFF,
                           torch.float32)
    for workers in (0, None):
        with pytest.raises(ValueError, match=r"graph 9 has elements \[1, 8\]"):
            list(make_loader(dataset, [[0, 1], [9, 2]], workers))


def test_assemble_batch_refuses_bad_arrays(union):
    """The compiled gather checks what it is given instead of reading out of bounds."""
    dataset = GraphDataset(union, np.arange(len(union)), Z_TABLE, CUTOFF, torch.float64)
    m = BatchAssembler(dataset, StoreArrays(union, 2**40)).memory

    def call(graphs, **change):
        args = {"atom_fields": [m["positions"], m["forces"]], "cells": m["cell"],
                "edge_index": m["edge_index"], "unit_shifts": m["unit_shifts"], **change}
        return torch.ops.cfmtrain.assemble_batch(
            torch.tensor(graphs), m["atoms_start"], m["num_atoms"], m["edges_start"],
            m["num_edges"], m["species"], len(Z_TABLE), args["atom_fields"],
            args["edge_index"], args["unit_shifts"], args["cells"],
            [m["energy"], m["pbc"]], None)

    assert call([3, 0])[0].tolist() == [0] * int(union.num_atoms[3]) + [1] * int(
        union.num_atoms[0])
    with pytest.raises(RuntimeError, match="graph 20 is outside"):
        call([0, 20])
    with pytest.raises(RuntimeError, match="must be a contiguous CPU tensor"):
        call([0], atom_fields=[m["positions"].T.contiguous().T, m["forces"]])  # column-major
    with pytest.raises(RuntimeError, match="cells must be Float, got Double"):
        call([0], atom_fields=[m["positions"].float(), m["forces"].float()])
    with pytest.raises(RuntimeError, match=r"cells must be \[stored graphs, 3, 3\]"):
        call([0], cells=m["cell"][:-1])
    with pytest.raises(RuntimeError, match="unit_shifts must be int8, int16 or int32"):
        call([0], unit_shifts=m["unit_shifts"].long())


def batches_of(loader) -> list:
    return [b.to_dict() for b in loader]


def test_prefetch_thread_and_workers_give_the_same_batches(union):
    dataset = GraphDataset(union, np.arange(len(union)), Z_TABLE, CUTOFF, torch.float32)
    batches = [list(range(i, i + 4)) for i in range(0, 20, 4)]
    inline = batches_of(make_loader(dataset, batches, 0))
    for workers in (None, 2):  # auto: a thread here
        got = batches_of(make_loader(dataset, batches, workers))
        assert len(got) == len(inline)
        for a, b in zip(got, inline, strict=True):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert store_arrays(union) is store_arrays(union)  # one copy of the arrays per store
    # Compare thread identities, not counts: the worker loader's queue-feeder threads may
    # still be ending on their own while this runs.
    before = set(threading.enumerate())
    iterator = iter(make_loader(dataset, batches))
    next(iterator)
    started = set(threading.enumerate()) - before
    assert [t.name for t in started] == ["cfmtrain-prefetch"]
    iterator.close()
    assert not any(t.is_alive() for t in started)  # close() returns once the thread stopped
    iterator = iter(make_loader(dataset, batches))
    next(iterator)
    started = set(threading.enumerate()) - before
    assert [t.name for t in started] == ["cfmtrain-prefetch"]
    del iterator
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.is_alive() for t in started)  # a loader dropped early stops its thread


def test_prefetch_hides_assembly_behind_compute():
    """The time `next` blocks (steps.csv's data_s) is only what compute did not hide."""
    def slow(items):
        time.sleep(0.05)
        return items

    from cfmtrain.batches.prefetch import BatchLoader

    waits = {}
    for workers in (0, THREAD):
        iterator, waits[workers] = iter(BatchLoader(slow, [[i] for i in range(5)], workers)), []
        for _ in range(5):
            start = time.perf_counter()
            next(iterator)
            waits[workers].append(time.perf_counter() - start)
            time.sleep(0.1)  # the training step
    assert min(waits[0]) >= 0.045
    assert sum(waits[THREAD][1:]) < 0.5 * sum(waits[0][1:])


def test_auto_workers_rule():
    assert resolve_workers(None, in_memory=True, cpus_per_rank=32) == THREAD
    assert resolve_workers(None, in_memory=False, cpus_per_rank=2) == THREAD
    assert resolve_workers(None, in_memory=False, cpus_per_rank=4) == 2
    assert resolve_workers(0, in_memory=False, cpus_per_rank=4) == 0
    assert resolve_workers(3, in_memory=True, cpus_per_rank=1) == 3


def test_bench_loader_on_a_tiny_store(union, tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "loader.csv"
    args = parser.parse_args(["--graphs", str(tmp_path / "tiny"), "--repeats", "1",
                              "--graphs-per-batch", "4", "--output", str(out)])
    write(tmp_path / "tiny", [emt_frames(6, seed=4)])
    threads = torch.get_num_threads()
    try:
        assert bench.run(args) == 0
    finally:
        torch.set_num_threads(threads)
    table = pd.read_csv(out)
    assert list(table.columns) == [
        "method", "graphs", "batches", "graphs_per_batch", "atoms", "edges", "repeats",
        "median_s", "graphs_per_s", "graphs_per_s_min", "graphs_per_s_max", "identical_to_mace",
        "vs_mace", "ratio_median", "ratio_p10", "ratio_p90", "rounds", "source"]
    assert (table.vs_mace == table.ratio_median).all() and (table.rounds == 1).all()
    assert len(table) == 3 and table.identical_to_mace.all() and (table.graphs == 6).all()
    assert (table.graphs_per_s > 0).all()
    assert not table.method.str.contains("before").any()  # the former path: full preset only
    try:
        assert bench.run(parser.parse_args(["--graphs", str(tmp_path / "tiny"), "--repeats", "1",
                                            "--graphs-per-batch", "4", "--output", str(out),
                                            "--preset", "full"])) == 0
    finally:
        torch.set_num_threads(threads)
    table = pd.read_csv(out)
    assert len(table) == 4 and table.method.str.contains("before").sum() == 1
