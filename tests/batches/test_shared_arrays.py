"""Store arrays held once per node: the first process writes the model-precision arrays beside
the store, the others memory-map the same files; batches equal those read from the shards."""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pytest
import torch
from helpers import CUTOFF, emt_frames
from mace.tools import AtomicNumberTable

from cfmtrain.batches.batching import BatchAssembler, batch_arrays
from cfmtrain.batches.data import GraphDataset
from cfmtrain.batches.shared import FOLDER, shared_arrays
from cfmtrain.batches.store_arrays import STORED, StoreArrays
from cfmtrain.bench import loader as bench
from cfmtrain.graphs.build import atoms_to_graph
from cfmtrain.graphs.store import GraphStore, file_state, write_shard

Z_TABLE = AtomicNumberTable([28, 29])
BATCH = [3, 0, 7, 7, 1]


def make_store(folder):
    folder.mkdir()
    graphs = [{**atoms_to_graph(a, CUTOFF), "source_index": i}
              for i, a in enumerate(emt_frames(9, seed=4))]
    write_shard(folder / "shard_0000.h5", graphs, cutoff=CUTOFF)
    return GraphStore(folder)


def _batch_in_child(folder, queue):
    store = GraphStore(folder)
    dataset = GraphDataset(store, np.arange(len(store)), Z_TABLE, CUTOFF, torch.float32)
    assembler = BatchAssembler(dataset, StoreArrays(store, 2**40))
    batch = assembler(BATCH)
    queue.put((batch.positions.numpy(), batch.edge_index.numpy()))


def test_memory_and_disk_batches_agree_and_the_arrays_are_files(tmp_path):
    store = make_store(tmp_path / "s")
    dataset = GraphDataset(store, np.arange(len(store)), Z_TABLE, CUTOFF, torch.float32)
    arrays = StoreArrays(store, 2**40)
    shared = BatchAssembler(dataset, arrays)
    disk = BatchAssembler(dataset, StoreArrays(store, 0))
    assert bench.batch_differences(shared(BATCH), disk(BATCH)) == []
    [derived] = arrays.derived.values()
    assert all(isinstance(v, np.memmap) for v in derived.values())
    assert derived["positions"].dtype == np.float32  # no float64 copy beside it
    # part by part from whole fields = at once from every graph's rows read from the shards
    everything = np.arange(len(store))
    ptr = np.concatenate([[0], np.cumsum(store.num_atoms)])
    reference = batch_arrays(StoreArrays(store, 0).rows(everything, STORED), ptr, dataset)
    assert set(derived) == set(reference)
    for name, value in reference.items():
        np.testing.assert_array_equal(derived[name], value, err_msg=name)
    assert len(list((tmp_path / "s" / FOLDER).iterdir())) == 2  # the arrays and their lock


@pytest.mark.slow
def test_processes_map_the_arrays_the_first_wrote(tmp_path):
    make_store(tmp_path / "s")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_batch_in_child, args=(tmp_path / "s", queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    folders = [p for p in (tmp_path / "s" / FOLDER).iterdir() if p.is_dir()]
    assert len(folders) == 1  # written once, not once per process


def test_a_store_folder_without_room_keeps_the_arrays_in_memory(tmp_path):
    blocked = tmp_path / "file"  # the cache's parent is a file: no folder can be made there
    blocked.write_text("")
    arrays = shared_arrays(blocked, "k", {"x": lambda: {"x": np.arange(4)}}, {})
    np.testing.assert_array_equal(arrays["x"], np.arange(4))
    assert not isinstance(arrays["x"], np.memmap)


def test_a_half_written_cache_is_rewritten(tmp_path):
    first = shared_arrays(tmp_path, "k", {"x": lambda: {"x": np.arange(5.0)}}, {})
    folder = next(p for p in (tmp_path / FOLDER).iterdir() if p.is_dir())
    (folder / "arrays.json").unlink()  # as a writer killed before its last file
    again = shared_arrays(tmp_path, "k", {"x": lambda: {"x": np.arange(5.0) * 2}}, {})
    np.testing.assert_array_equal(again["x"], np.arange(5.0) * 2)
    np.testing.assert_array_equal(first["x"], np.arange(5.0))


def test_arrays_of_a_rebuilt_store_replace_the_old_ones(tmp_path):
    shard = tmp_path / "shard_0000.h5"
    shard.write_bytes(b"old")
    old_sources = {str(shard): file_state(shard)}
    old = shared_arrays(tmp_path, "f32", {"x": lambda: {"x": np.arange(3)}}, old_sources)
    shared_arrays(tmp_path, "f64", {"x": lambda: {"x": np.arange(3.0)}}, old_sources)
    assert len([p for p in (tmp_path / FOLDER).iterdir() if p.is_dir()]) == 2  # one store
    shard.write_bytes(b"new")  # rebuilt: another version of the file
    new = shared_arrays(tmp_path, "f32", {"x": lambda: {"x": np.arange(4)}},
                        {str(shard): file_state(shard)})
    kept = [p for p in (tmp_path / FOLDER).iterdir() if p.is_dir()]
    assert len(kept) == 1 and json.loads((kept[0] / "arrays.json").read_text())["sources"] == \
        {str(shard): file_state(shard)}
    assert not [p for p in (tmp_path / FOLDER).glob("*.lock") if p.stem != kept[0].name]
    np.testing.assert_array_equal(old["x"], np.arange(3))  # still mapped after the removal
    np.testing.assert_array_equal(new["x"], np.arange(4))
