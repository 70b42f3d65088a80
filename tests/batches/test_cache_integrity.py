"""The batch-array cache is keyed by what it derives from and checked before use: a shard edited
or replaced (even with its old modification time), another cfmtrain derivation, a damaged or
half-written cache, a dead writer's leftovers, a full disk; unions sharing a store keep theirs."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest
import torch
from helpers import CUTOFF, emt_frames
from mace.tools import AtomicNumberTable

from cfmtrain.batches import batching
from cfmtrain.batches.batching import BatchAssembler
from cfmtrain.batches.data import GraphDataset
from cfmtrain.batches.shared import FOLDER, shared_arrays
from cfmtrain.batches.store_arrays import StoreArrays
from cfmtrain.graphs.build import atoms_to_graph
from cfmtrain.graphs.store import GraphStore, ShardError, file_state, verified, write_shard

Z_TABLE = AtomicNumberTable([28, 29])
BATCH = [4, 1, 6]


def write_graphs(path, seed: int, scale: float = 1.0):
    graphs = []
    for i, a in enumerate(emt_frames(8, seed=seed)):
        g = atoms_to_graph(a, CUTOFF)
        graphs.append({**g, "source_index": i, "forces": g["forces"] * scale,
                       "energy": g["energy"] * scale})
    write_shard(path, graphs, cutoff=CUTOFF)
    return path


def assembled(folders):
    """The batch BATCH of the store (a folder or a union) through the in-memory cache."""
    store = GraphStore(folders)
    dataset = GraphDataset(store, np.arange(len(store)), Z_TABLE, CUTOFF, torch.float32)
    return BatchAssembler(dataset, StoreArrays(store, 2**40))(BATCH)


def from_shards(folders):
    """The same batch read from the shards, no cache."""
    store = GraphStore(folders)
    dataset = GraphDataset(store, np.arange(len(store)), Z_TABLE, CUTOFF, torch.float32)
    return BatchAssembler(dataset, StoreArrays(store, 0))(BATCH)


def caches(folder):
    return sorted(p for p in (folder / FOLDER).iterdir() if p.is_dir())


def same_batch(a, b) -> bool:
    return all(torch.equal(getattr(a, k), getattr(b, k))
               for k in ("positions", "forces", "energy", "edge_index", "shifts"))


def test_a_shard_edited_in_place_is_derived_anew(tmp_path):
    shard = write_graphs(tmp_path / "s" / "shard_0000.h5", seed=1)
    before = assembled(tmp_path / "s")
    with h5py.File(shard, "r+") as f:  # moved atoms, checksums kept valid
        f["positions"][...] = f["positions"][...] + 0.01
    after = assembled(tmp_path / "s")
    assert same_batch(after, from_shards(tmp_path / "s"))
    assert not torch.equal(after.positions, before.positions)
    assert len(caches(tmp_path / "s")) == 1, "the old shard's arrays are removed"


def test_a_shard_replaced_by_a_copy_with_its_old_times_is_checked_and_derived_anew(tmp_path):
    shard = write_graphs(tmp_path / "s" / "shard_0000.h5", seed=1)
    old = os.stat(shard)
    assembled(tmp_path / "s")
    other = write_graphs(tmp_path / "other.h5", seed=1, scale=1.5)  # same graphs, new labels
    assert other.stat().st_size == old.st_size
    shutil.copyfile(other, shard)
    os.utime(shard, ns=(old.st_atime_ns, old.st_mtime_ns))  # as cp -p, rsync -a, tar x leave
    assert not verified(shard), "a new change time: the stamp no longer vouches for it"
    after = assembled(tmp_path / "s")
    np.testing.assert_allclose(after.energy.numpy(), from_shards(tmp_path / "s").energy.numpy())
    assert same_batch(after, from_shards(tmp_path / "s"))


def test_a_shard_replaced_while_its_store_is_open_is_named_at_its_first_read(tmp_path):
    shard = write_graphs(tmp_path / "s" / "shard_0000.h5", seed=2)
    store = GraphStore(tmp_path / "s")
    os.rename(write_graphs(tmp_path / "new.h5", seed=3), shard)
    with pytest.raises(ShardError, match=r"shard_0000\.h5.*replaced or edited since"):
        store[0]
    with pytest.raises(ShardError, match=r"shard_0000\.h5.*replaced or edited since"):
        StoreArrays(store, 2**40)


def test_arrays_an_older_derivation_wrote_are_not_served(tmp_path, monkeypatch):
    write_graphs(tmp_path / "s" / "shard_0000.h5", seed=1)
    real_parts = batching.batch_parts

    def older_parts(load, ptr, dataset):  # an older cfmtrain that derived positions otherwise
        parts = real_parts(load, ptr, dataset)
        return {**parts, "positions": lambda: {"positions": load("positions").astype(
            np.float32) + 1.0}}

    monkeypatch.setattr(batching, "batch_parts", older_parts)
    monkeypatch.setattr(batching, "DERIVED_BY", "older")
    wrong = assembled(tmp_path / "s")
    monkeypatch.setattr(batching, "batch_parts", real_parts)
    monkeypatch.setattr(batching, "DERIVED_BY", batching.code_digest(batching))
    right = assembled(tmp_path / "s")
    assert not same_batch(wrong, right)
    assert same_batch(right, from_shards(tmp_path / "s"))


@pytest.mark.parametrize("damage", ["flip", "half", "record", "unlisted"])
def test_a_damaged_cache_is_named_removed_and_rebuilt(tmp_path, capfd, damage):
    write_graphs(tmp_path / "s" / "shard_0000.h5", seed=1)
    reference = assembled(tmp_path / "s")
    [folder] = caches(tmp_path / "s")
    target = folder / "forces.npy"
    if damage == "flip":  # the last bytes of the data, size kept
        data = bytearray(target.read_bytes())
        data[-12:] = bytes(b ^ 0x5A for b in data[-12:])
        target.write_bytes(bytes(data))
    elif damage == "half":
        with open(target, "r+b") as f:
            f.truncate(target.stat().st_size // 2)
    elif damage == "record":
        (folder / "arrays.json").write_text('{"format": 2, "files": ')
    else:  # valid JSON, one array's entry gone
        record = json.loads((folder / "arrays.json").read_text())
        del record["files"]["species"]
        (folder / "arrays.json").write_text(json.dumps(record))
    capfd.readouterr()
    again = assembled(tmp_path / "s")
    err = capfd.readouterr().err
    assert f"batch-array cache {folder}" in err and "rebuilding it" in err
    assert len(err.strip().splitlines()) == 1
    assert same_batch(again, reference)
    assert caches(tmp_path / "s") == [folder] and json.loads((folder / "arrays.json").read_text())


WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from pathlib import Path
    from cfmtrain.batches.shared import shared_arrays

    def slow():
        print("writing", flush=True)
        time.sleep(60)
        return {"b": np.ones(3)}

    shared_arrays(Path(sys.argv[1]), "k", {"a": lambda: {"a": np.arange(10.0)}, "b": slow}, {})
""")


def test_a_killed_writer_leaves_nothing_that_outlives_the_next_write(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "writing"
    leftover = [p for p in (tmp_path / FOLDER).iterdir() if ".tmp" in p.name]
    assert len(leftover) == 1 and (leftover[0] / "a.npy").is_file()
    child.send_signal(signal.SIGKILL)
    child.wait()
    arrays = shared_arrays(tmp_path, "k", {"a": lambda: {"a": np.arange(10.0)}}, {})
    np.testing.assert_array_equal(arrays["a"], np.arange(10.0))
    assert not [p for p in (tmp_path / FOLDER).iterdir() if ".tmp" in p.name]


def test_unions_sharing_a_store_keep_each_others_arrays(tmp_path, monkeypatch):
    for name, seed in (("a", 1), ("b", 2), ("c", 3)):
        write_graphs(tmp_path / name / "shard_0000.h5", seed=seed)
    written = []
    real = batching.shared_arrays

    def counted(folder, key, parts, sources):
        before = set(caches(tmp_path / "a")) if (tmp_path / "a" / FOLDER).exists() else set()
        out = real(folder, key, parts, sources)
        written.extend(set(caches(tmp_path / "a")) - before)
        return out

    monkeypatch.setattr(batching, "shared_arrays", counted)
    ab, ac = [tmp_path / "a", tmp_path / "b"], [tmp_path / "a", tmp_path / "c"]
    for union in (ab, ac, ab, ac):
        assert same_batch(assembled(union), from_shards(union))
    assert len(written) == 2, "each union's arrays are written once, then mapped"
    assert len(caches(tmp_path / "a")) == 2


FULL = textwrap.dedent("""
    import resource, signal, sys
    import numpy as np
    from pathlib import Path
    from cfmtrain.batches.shared import shared_arrays

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
    arrays = shared_arrays(Path(sys.argv[1]), "k", {"a": lambda: {"a": np.arange(1e5)}}, {})
    assert not isinstance(arrays["a"], np.memmap)
    np.testing.assert_array_equal(arrays["a"], np.arange(1e5))
""")


@pytest.mark.slow
def test_a_cache_that_does_not_fit_on_disk_is_said_and_held_in_memory(tmp_path):
    assert resource.getrlimit(resource.RLIMIT_FSIZE)[1] == resource.RLIM_INFINITY
    run = subprocess.run([sys.executable, "-c", FULL, str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert f"{tmp_path / FOLDER}" in run.stderr and "cannot write batch arrays" in run.stderr
    assert not [p for p in (tmp_path / FOLDER).iterdir() if p.is_dir()], "no half cache left"


def test_file_state_sees_a_copy_that_keeps_the_times(tmp_path):
    a = tmp_path / "a"
    a.write_bytes(b"x" * 100)
    state = file_state(a)
    time.sleep(0.01)
    shutil.copy2(a, tmp_path / "b")
    os.replace(tmp_path / "b", a)
    assert file_state(a)["mtime_ns"] == state["mtime_ns"] and file_state(a) != state
