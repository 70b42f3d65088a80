"""HDF5 graph shards: round trip through write_shard and GraphStore, folders of shards,
fork safety, and no half-written file on failure."""

import multiprocessing
import pickle

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk, molecule

from cfmtrain.graphs.build import atoms_to_graph
from cfmtrain.graphs.store import GraphStore, write_shard

CUTOFF = 4.5


def labelled(atoms: Atoms, subset: str, seed: int, stress: bool = True) -> Atoms:
    rng = np.random.default_rng(seed)
    atoms.info["REF_energy"] = float(rng.normal())
    atoms.arrays["REF_forces"] = rng.normal(size=(len(atoms), 3))
    if stress:
        atoms.info["REF_stress"] = rng.normal(size=(3, 3))
    atoms.info["config_type"] = subset
    return atoms


def sample_frames() -> list[Atoms]:
    cu = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    cu.rattle(0.05, seed=1)
    water = molecule("H2O")
    single = Atoms("Ar", positions=[[0, 0, 0]])  # no edges
    tiny = bulk("Al", "fcc", a=4.05)  # one atom, periodic self-images
    return [labelled(cu, "metal", 0), labelled(water, "water", 1, stress=False),
            labelled(single, "noble", 2, stress=False), labelled(tiny, "metal", 3)]


def graphs_of(frames):
    for index, atoms in enumerate(frames):
        graph = atoms_to_graph(atoms, CUTOFF)
        graph["source_index"] = index
        yield graph


def assert_graph_equal(read: dict, atoms: Atoms):
    expected = atoms_to_graph(atoms, CUTOFF)
    for key in ("positions", "numbers", "cell", "pbc", "edge_index", "unit_shifts", "forces"):
        np.testing.assert_array_equal(read[key], expected[key], err_msg=key)
    assert read["energy"] == expected["energy"]
    assert read["subset"] == expected["subset"]
    if expected["stress"] is None:
        assert "stress" not in read
    else:
        np.testing.assert_array_equal(read["stress"], expected["stress"])
    vectors = (read["positions"][read["edge_index"][1]] - read["positions"][read["edge_index"][0]]
               + read["unit_shifts"] @ read["cell"])
    assert (np.linalg.norm(vectors, axis=1) < CUTOFF).all()


def test_round_trip_one_shard(tmp_path):
    frames = sample_frames()
    assert write_shard(tmp_path / "shard_0000.h5", graphs_of(frames), cutoff=CUTOFF) == 4
    store = GraphStore(tmp_path / "shard_0000.h5")
    assert len(store) == 4 and store.cutoff == CUTOFF
    for i, atoms in enumerate(frames):
        assert_graph_equal(store[i], atoms)
    np.testing.assert_array_equal(store.num_atoms, [len(a) for a in frames])
    assert store.num_edges[2] == 0 and store.num_edges[3] == 18  # fcc Al: 12 + 6 images
    assert store[-1]["subset"] == "metal"
    with pytest.raises(IndexError, match="out of range"):
        store[4]


def test_folder_of_shards_indexes_globally_and_merges_subsets(tmp_path):
    frames = sample_frames()
    write_shard(tmp_path / "shard_0000.h5", graphs_of(frames[:2]), cutoff=CUTOFF)
    write_shard(tmp_path / "shard_0001.h5", graphs_of(frames[2:]), cutoff=CUTOFF)
    store = GraphStore(tmp_path)
    assert len(store) == 4
    for i, atoms in enumerate(frames):
        assert_graph_equal(store[i], atoms)
    assert [store.subset_names[s] for s in store.subsets] == ["metal", "water", "noble", "metal"]


def test_empty_shard(tmp_path):
    write_shard(tmp_path / "shard_0000.h5", [], cutoff=CUTOFF)
    assert len(GraphStore(tmp_path)) == 0


def _read_in_child(store, queue):
    inherited = store._handles[0]  # the parent's open h5py handle, copied by fork
    total = store[0]["positions"].sum()
    queue.put((total, store._handles[0] is not inherited))


def test_fork_reopens_handles_and_pickles(tmp_path):
    write_shard(tmp_path / "shard_0000.h5", graphs_of(sample_frames()), cutoff=CUTOFF)
    store = GraphStore(tmp_path)
    expected = store[0]["positions"].sum()  # opens a handle in the parent
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(store, queue))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and queue.get(timeout=5) == (expected, True)
    clone = pickle.loads(pickle.dumps(store))
    assert clone[0]["positions"].sum() == expected


def test_dataloader_workers_read_the_store(tmp_path):
    """Forked DataLoader workers read every graph, with handles first opened in the parent."""
    import torch

    write_shard(tmp_path / "shard_0000.h5", graphs_of(sample_frames()), cutoff=CUTOFF)
    store = GraphStore(tmp_path)
    expected = [float(store[i]["positions"].sum()) for i in range(len(store))]
    loader = torch.utils.data.DataLoader(_PositionSums(store), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    assert [float(x) for x in loader] == expected


class _PositionSums:
    """A map-style dataset over a GraphStore (one number per graph)."""

    def __init__(self, store: GraphStore) -> None:
        self.store = store

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i: int) -> float:
        return float(self.store[i]["positions"].sum())


def test_failed_write_leaves_no_file(tmp_path):
    def broken():
        yield from graphs_of(sample_frames()[:1])
        raise RuntimeError("source broke mid-way")

    with pytest.raises(RuntimeError, match="mid-way"):
        write_shard(tmp_path / "shard_0000.h5", broken(), cutoff=CUTOFF)
    assert list(tmp_path.iterdir()) == []


def test_mixed_cutoffs_are_refused(tmp_path):
    write_shard(tmp_path / "shard_0000.h5", graphs_of(sample_frames()[:1]), cutoff=CUTOFF)
    write_shard(tmp_path / "shard_0001.h5", [], cutoff=5.0)
    with pytest.raises(ValueError, match="cutoff"):
        GraphStore(tmp_path)


def test_missing_store_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no graph shard"):
        GraphStore(tmp_path)


def test_union_of_stores_in_list_order(tmp_path):
    frames = sample_frames()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_shard(tmp_path / "a" / "shard_0000.h5", graphs_of(frames[2:]), cutoff=CUTOFF)
    write_shard(tmp_path / "b" / "shard_0000.h5", graphs_of(frames[:2]), cutoff=CUTOFF)
    store = GraphStore([tmp_path / "b", tmp_path / "a"])
    assert len(store) == 4
    for i, atoms in enumerate(frames):
        assert_graph_equal(store[i], atoms)


def test_shift_beyond_int8_is_widened_not_wrapped(tmp_path):
    import h5py

    graph = next(iter(graphs_of(sample_frames()[:1])))
    graph["unit_shifts"] = np.full_like(graph["unit_shifts"], 200, dtype=np.int32)
    write_shard(tmp_path / "shard_0000.h5", [graph], cutoff=CUTOFF)
    with h5py.File(tmp_path / "shard_0000.h5") as f:
        assert f["unit_shifts"].dtype == np.int16
    assert (GraphStore(tmp_path)[0]["unit_shifts"] == 200).all()
    graph["unit_shifts"] = np.full_like(graph["unit_shifts"], 2**31, dtype=np.int64)
    with pytest.raises(ValueError, match="shard_0001.h5: unit shift 2147483648 beyond int32"):
        write_shard(tmp_path / "shard_0001.h5", [graph], cutoff=CUTOFF)
    assert not (tmp_path / "shard_0001.h5").exists()


def test_blocks_write_the_same_shard_as_one_block(tmp_path):
    frames = sample_frames() * 3
    write_shard(tmp_path / "one" / "shard_0000.h5", graphs_of(frames), cutoff=CUTOFF)
    write_shard(tmp_path / "blocks" / "shard_0000.h5", graphs_of(frames), cutoff=CUTOFF,
                block_edges=40)
    one, blocks = GraphStore(tmp_path / "one"), GraphStore(tmp_path / "blocks")
    assert len(one) == len(blocks) == len(frames)
    for i, atoms in enumerate(frames):
        assert_graph_equal(blocks[i], atoms)
        for key, value in one[i].items():
            np.testing.assert_array_equal(blocks[i][key], value, err_msg=key)


def test_a_later_block_widens_the_shifts_of_earlier_ones(tmp_path):
    import h5py

    graphs = list(graphs_of(sample_frames()))
    wide = dict(graphs[0], unit_shifts=np.full_like(graphs[0]["unit_shifts"], 300, np.int32))
    write_shard(tmp_path / "shard_0000.h5", [*graphs, wide], cutoff=CUTOFF, block_edges=1)
    with h5py.File(tmp_path / "shard_0000.h5") as f:
        assert f["unit_shifts"].dtype == np.int16
    store = GraphStore(tmp_path)
    for i, graph in enumerate([*graphs, wide]):
        np.testing.assert_array_equal(store[i]["unit_shifts"], graph["unit_shifts"])


def test_the_writers_memory_does_not_grow_with_its_shard(tmp_path):
    """The writer holds one block of about `block_edges` edges: ten times the graphs, about
    the same peak (traced numpy and Python allocations)."""
    import tracemalloc

    base = list(graphs_of(sample_frames()[:1]))[0]  # 32 atoms, ~1,700 edges

    def peak(count: int) -> int:
        graphs = (dict(base, source_index=i) for i in range(count))  # made as written
        tracemalloc.start()
        write_shard(tmp_path / f"shard_{count:04d}.h5", graphs, cutoff=CUTOFF,
                    block_edges=20_000)
        size = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return size

    small, large = peak(40), peak(400)
    assert len(GraphStore(tmp_path / "shard_0400.h5")) == 400
    assert large < 1.5 * small, (small, large)
