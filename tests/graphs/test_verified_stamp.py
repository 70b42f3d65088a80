"""The edge-index check runs once per shard file: its stamp lets later opens read only the
per-graph table; a shard rewritten since is verified again, and one corrupted in place is still
refused, naming the file."""

import os
from collections import Counter

import h5py
import numpy as np
import pytest
from ase.build import bulk

from cfmtrain.graphs import store as store_module
from cfmtrain.graphs.build import build_graphs
from cfmtrain.graphs.store import GraphStore, ShardError, verified, write_shard

CUTOFF = 4.5


def shard(path, count: int = 4):
    frames = []
    for k in range(count):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
        atoms.rattle(0.05, seed=k)
        atoms.info["REF_energy"] = float(k)
        atoms.arrays["REF_forces"] = np.zeros((len(atoms), 3))
        atoms.info["config_type"] = "cu"
        frames.append(atoms)
    write_shard(path, build_graphs(frames, "src", CUTOFF, False, Counter()), cutoff=CUTOFF)
    return path


@pytest.fixture
def passes(monkeypatch):
    """Counts the edge-index passes run."""
    calls = []
    real = store_module.check_edge_index

    def counted(*args):
        calls.append(args[0])
        return real(*args)

    monkeypatch.setattr(store_module, "check_edge_index", counted)
    return calls


def test_the_edge_pass_runs_once_per_shard_file(tmp_path, passes):
    path = shard(tmp_path / "shard_0000.h5")
    assert not verified(path)
    GraphStore(path)
    assert len(passes) == 1 and verified(path)
    reference = GraphStore(path)[2]
    assert len(passes) == 1, "a stamped shard's edges are not read again at open"
    again = GraphStore(path, check_edges=True)[2]
    for key, value in reference.items():
        np.testing.assert_array_equal(again[key], value)
    assert len(passes) == 1


def test_a_shard_rewritten_after_its_stamp_is_verified_again_and_refused(tmp_path, passes):
    path = shard(tmp_path / "shard_0000.h5")
    GraphStore(path)
    with h5py.File(path, "r+") as f:  # valid checksums, an out-of-range receiver
        edges = f["edge_index"][:]
        edges[1, 0] = 10_000
        f["edge_index"][...] = edges
    assert not verified(path)
    with pytest.raises(ShardError, match=r"shard_0000\.h5.*edge index 10000 out of range"):
        GraphStore(path)
    assert len(passes) == 2


def test_a_shard_corrupted_in_place_after_its_stamp_is_refused_on_read(tmp_path):
    path = shard(tmp_path / "shard_0000.h5")
    GraphStore(path)
    with h5py.File(path, "r") as f:
        offset = f["positions"].id.get_chunk_info(0).byte_offset
    state = os.stat(path)
    with open(path, "r+b") as fh:  # flip bytes of the positions, keep size and times
        fh.seek(offset + 16)
        fh.write(b"\xff" * 8)
    os.utime(path, ns=(state.st_atime_ns, state.st_mtime_ns))
    assert not verified(path), "same size and modification time, but a new change time"
    store = GraphStore(path)
    with pytest.raises(ShardError, match=r"shard_0000\.h5"):
        store[0]


def test_a_stamped_open_reads_the_stamp_alone_and_gets_the_files_table(tmp_path, monkeypatch):
    path = shard(tmp_path / "shard_0000.h5", count=6)
    checked = GraphStore(path)  # checks the file, writes the stamp
    opened = []
    real = store_module.open_shard
    monkeypatch.setattr(store_module, "open_shard", lambda p: opened.append(p) or real(p))
    again = GraphStore(path)
    assert opened == [], "the per-graph table and attributes come from the stamp"
    for key in ("num_atoms", "num_edges", "subsets"):
        np.testing.assert_array_equal(getattr(again, key), getattr(checked, key))
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(again.num_atoms, f["num_atoms"][:])
        np.testing.assert_array_equal(again.num_receivers, f["num_receivers"][:])
    assert (again.cutoff, again.subset_names, again.fingerprint) == (
        checked.cutoff, checked.subset_names, checked.fingerprint)


@pytest.mark.parametrize("stamp", [b'{"format_version": 2, "bytes": 1, "mtime_ns": 1}',
                                   b"PK\x03\x04 truncated", b""])
def test_an_unreadable_or_older_stamp_means_the_shard_is_checked_again(tmp_path, passes, stamp):
    path = shard(tmp_path / "shard_0000.h5")
    stamp_path = tmp_path / "shard_0000.h5.verified"
    stamp_path.write_bytes(stamp)
    assert not verified(path)
    GraphStore(path)
    assert len(passes) == 1 and verified(path), "checked, and stamped anew"
