"""Graph-store integrity: unreadable shards name their file; skewed and tiny cells are
stored with wider unit shifts or refused (file, frame, reason) and skipped by --skip-invalid;
Fletcher-32 checksums and a manifest on every shard; corruption and out-of-range edge indices are
errors naming the shard and graph; `from cfmtrain.graphs import GraphStore`."""

import json
import re
from collections import Counter

import ase.io
import h5py
import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from ase.neighborlist import neighbor_list

from cfmtrain.batches.store_arrays import StoreArrays
from cfmtrain.cli import main
from cfmtrain.frames.neighbors import GraphTooLargeError, radius_graph
from cfmtrain.frames.validate import InvalidFrameError
from cfmtrain.graphs import store as store_module
from cfmtrain.graphs.build import build_graphs, build_shard
from cfmtrain.graphs.store import FORMAT_VERSION, GraphStore, ShardError, write_shard

CUTOFF = 4.5
SKEWED = [[3.0, 0.0, 0.0], [600.5, 3.0, 0.0], [0.0, 0.0, 5.0]]  # b - 200 a = (0.5, 3, 0)


def labelled(atoms: Atoms, seed: int = 0) -> Atoms:
    rng = np.random.default_rng(seed)
    atoms.info["REF_energy"] = float(rng.normal())
    atoms.arrays["REF_forces"] = rng.normal(size=(len(atoms), 3))
    atoms.info["REF_stress"] = rng.normal(size=6)
    atoms.info["config_type"] = "test"
    return atoms


def skewed() -> Atoms:
    return labelled(Atoms("CuNi", cell=SKEWED, pbc=True,
                          scaled_positions=[[0.1, 0.2, 0.3], [0.6, 0.7, 0.8]]), 1)


def tiny_1d() -> Atoms:  # one atom 0.03 Å from its own images along x
    return labelled(Atoms("Cu", cell=np.diag([0.03, 10.0, 10.0]), pbc=(True, False, False)), 2)


def tiny_3d() -> Atoms:  # a 0.03 Å cube: ~1.4e7 images of the atom within the cutoff
    return labelled(Atoms("Cu", cell=np.eye(3) * 0.03, pbc=True), 3)


def crystals(count: int, seed: int = 0) -> list[Atoms]:
    frames = []
    for k in range(count):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
        atoms.rattle(0.05, seed=seed + k)
        frames.append(labelled(atoms, seed + k))
    return frames


def write_frames(path, frames) -> None:
    write_shard(path, build_graphs(frames, "src", CUTOFF, False, Counter()), cutoff=CUTOFF)


def edge_set(i, j, shifts) -> list:
    return sorted(zip(np.asarray(i).tolist(), np.asarray(j).tolist(),
                      map(tuple, np.asarray(shifts).tolist()), strict=True))


def test_graph_store_imports_where_the_readme_says():
    import cfmtrain.graphs
    from cfmtrain.graphs import GraphStore as exported

    assert exported is GraphStore and cfmtrain.graphs.GraphStore is GraphStore
    with pytest.raises(AttributeError):
        cfmtrain.graphs.NoSuchThing  # noqa: B018


# ---------------------------------------------------------------- unreadable files


def test_zero_byte_shard_names_the_file(tmp_path):
    (tmp_path / "shard_0000.h5").touch()
    with pytest.raises(ShardError, match=re.escape(str(tmp_path / "shard_0000.h5"))):
        GraphStore(tmp_path)


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_truncated_shard_names_the_file(tmp_path, keep):
    path = tmp_path / "shard_0001.h5"
    write_frames(tmp_path / "shard_0000.h5", crystals(2))
    write_frames(path, crystals(3))
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ShardError, match=re.escape(str(path)) + ": .*truncated"):
        GraphStore(tmp_path)


def test_old_format_is_refused_with_rebuild(tmp_path):
    path = tmp_path / "shard_0000.h5"
    write_frames(path, crystals(1))
    with h5py.File(path, "r+") as f:
        f.attrs["format_version"] = 1
    with pytest.raises(ShardError, match=re.escape(str(path)) + ": graph shard of format 1.*"
                       "rebuild it"):
        GraphStore(path)


# ---------------------------------------------------------------- skewed and tiny cells


def test_skewed_cell_is_stored_exactly_with_int16_shifts(tmp_path):
    atoms = skewed()
    graph = radius_graph(atoms.positions, atoms.cell.array, atoms.pbc, CUTOFF)
    i, j, shifts = neighbor_list("ijS", atoms, CUTOFF)
    assert abs(shifts).max() > 127 and graph.unit_shifts.dtype == np.int16
    assert edge_set(*graph.edge_index, graph.unit_shifts) == edge_set(i, j, shifts)
    frames = [*crystals(2), atoms]
    write_frames(tmp_path / "shard_0000.h5", frames)
    write_frames(tmp_path / "shard_0001.h5", crystals(2, seed=5))  # stays int8
    with h5py.File(tmp_path / "shard_0000.h5") as f:
        assert f["unit_shifts"].dtype == np.int16
        assert json.loads(f.attrs["manifest"])["unit_shifts"] == "int16"
    with h5py.File(tmp_path / "shard_0001.h5") as f:
        assert f["unit_shifts"].dtype == np.int8
    store = GraphStore(tmp_path)
    for k, frame in enumerate(frames):
        read = store[k]
        i, j, shifts = neighbor_list("ijS", frame, CUTOFF)
        assert edge_set(*read["edge_index"], read["unit_shifts"]) == edge_set(i, j, shifts)
    # the loader's arrays (int8 and int16 shards together), in memory and from disk
    for budget in (2**40, 0):
        arrays = StoreArrays(store, budget)
        rows = arrays.rows(np.array([2, 4]), ("unit_shifts", "edge_index"))
        np.testing.assert_array_equal(
            rows["unit_shifts"], np.concatenate([store[2]["unit_shifts"], store[4]["unit_shifts"]]))
        arrays.close()


def test_tiny_cells_are_refused_with_file_frame_reason_and_skipped(tmp_path):
    with pytest.raises(GraphTooLargeError, match="cell too small for the cutoff"):
        radius_graph(np.zeros((1, 3)), np.eye(3) * 0.03, [True] * 3, CUTOFF)
    source = tmp_path / "frames_0000.extxyz"
    good = crystals(2)
    ase.io.write(source, [good[0], tiny_3d(), skewed(), tiny_1d(), good[1]], format="extxyz")
    with pytest.raises(InvalidFrameError, match=re.escape(str(source)) + r": frame 1: cell too "
                       r"small for the cutoff \(about 1.41e\+07 periodic images"):
        build_shard(source, tmp_path / "shard_0000.h5", CUTOFF)
    ase.io.write(source, [good[0], tiny_1d(), good[1]], format="extxyz")
    with pytest.raises(InvalidFrameError, match=re.escape(str(source)) + r": frame 1: "
                       r"overlapping atoms \(two atoms \(or an atom and a periodic image\) 0.03 A"):
        build_shard(source, tmp_path / "shard_0000.h5", CUTOFF)
    assert not list(tmp_path.glob("*.h5"))
    ase.io.write(source, [good[0], tiny_3d(), skewed(), tiny_1d(), good[1]], format="extxyz")
    shard = tmp_path / "shard_0000.h5"
    assert main(["graphs", "--input", str(source), "--output", str(shard), "--skip-invalid"]) == 0
    report = json.loads(shard.with_suffix(".json").read_text())
    assert report["graphs"] == 3 and report["unit_shifts"] == "int16"
    assert report["skipped_by_reason"] == {"cell too small for the cutoff": 1,
                                           "overlapping atoms": 1}
    store = GraphStore(shard)
    assert report["edges"] == store.num_edges.sum() and report["atoms"] == store.num_atoms.sum()
    i, j, shifts = neighbor_list("ijS", skewed(), CUTOFF)
    assert edge_set(*store[1]["edge_index"], store[1]["unit_shifts"]) == edge_set(i, j, shifts)


# ---------------------------------------------------------------- checksums and manifest


def test_every_dataset_has_a_checksum_and_the_manifest_counts(tmp_path):
    path = tmp_path / "shard_0000.h5"
    frames = [*crystals(3), skewed()]
    write_frames(path, frames)
    with h5py.File(path) as f:
        assert f.attrs["format_version"] == FORMAT_VERSION
        assert all(f[k].fletcher32 for k in f), [k for k in f if not f[k].fletcher32]
        manifest = json.loads(f.attrs["manifest"])
        assert manifest["graphs"] == 4 and manifest["atoms"] == sum(map(len, frames))
        assert manifest["edges"] == f["edge_index"].shape[1] == f["num_edges"][:].sum()
    write_shard(tmp_path / "shard_0001.h5", [], cutoff=CUTOFF)  # empty datasets too
    with h5py.File(tmp_path / "shard_0001.h5") as f:
        assert all(f[k].fletcher32 for k in f)
    assert len(GraphStore(tmp_path)) == 4


def test_manifest_disagreeing_with_a_dataset_is_refused(tmp_path):
    path = tmp_path / "shard_0000.h5"
    write_frames(path, crystals(2))
    with h5py.File(path, "r+") as f:
        forces = f["forces"][:-1]
        del f["forces"]
        f.create_dataset("forces", data=forces)
    with pytest.raises(ShardError, match=re.escape(str(path)) + ": dataset forces has shape"):
        GraphStore(path)


def read_everything(path) -> None:
    """Open the store, read every graph, then the loader's arrays in memory and from disk."""
    store = GraphStore(path)
    for k in range(len(store)):
        store[k]
    everything = np.arange(len(store))
    for budget in (2**40, 0):
        StoreArrays(store, budget).rows(everything, ("positions", "numbers", "forces",
                                                     "edge_index", "unit_shifts", "cell", "pbc",
                                                     "energy", "stress", "has_stress"))


@pytest.mark.parametrize("target", ["positions", "forces", "numbers", "edge_index", "unit_shifts",
                                    "num_atoms", "cell", "energy", "middle"])
def test_random_bytes_in_a_shard_are_an_error_naming_it(tmp_path, target):
    path = tmp_path / "shard_0000.h5"
    write_frames(path, crystals(40))  # 1,280 atoms, ~100k edges: most datasets span > 8 KiB
    read_everything(path)  # intact: reads
    with h5py.File(path) as f:
        data = f["positions" if target == "middle" else target]
        offset = (path.stat().st_size // 2 if target == "middle" else data.id.get_offset()
                  if data.chunks is None else data.id.get_chunk_info(0).byte_offset)
    noise = np.random.default_rng(0).integers(0, 256, 8192, dtype=np.uint8).tobytes()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(noise)
    with pytest.raises(ShardError, match=re.escape(str(path))):
        read_everything(path)


def test_corruption_read_later_names_shard_and_graph(tmp_path):
    path = tmp_path / "shard_0000.h5"
    write_frames(path, crystals(4))
    with h5py.File(path) as f:
        offset = f["forces"].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as f:
        f.seek(offset + 100)
        f.write(b"\xff" * 8)
    store = GraphStore(path)  # forces are not read at open
    with pytest.raises(ShardError, match=re.escape(str(path))
                       + ": graph 2: data failing its Fletcher-32 checksum"):
        store[2]
    with pytest.raises(ShardError, match=re.escape(str(path)) + ": data failing its"):
        StoreArrays(store, 2**40).load("forces")
    with pytest.raises(ShardError, match=re.escape(str(path)) + ": data failing its"):
        StoreArrays(store, 0).rows(np.array([2]), ("forces",))


# ---------------------------------------------------------------- edge indices


@pytest.mark.parametrize("bad", [32, -1, 2**20])
@pytest.mark.parametrize("block", [1 << 23, 50])  # one pass, or blocks of ~50 edges
def test_edge_index_out_of_range_names_shard_and_graph(tmp_path, monkeypatch, bad, block):
    monkeypatch.setattr(store_module, "CHECK_EDGES", block)
    argon = labelled(bulk("Ar", "fcc", a=5.26))  # one atom: its edges are to its own images
    graphs = list(build_graphs([*crystals(3), argon, *crystals(2, seed=9)], "src", CUTOFF,
                               False, Counter()))
    graphs[4]["edge_index"] = graphs[4]["edge_index"].copy()
    graphs[4]["edge_index"][1, -1] = bad  # 32 atoms: index 32 is one past the end
    path = tmp_path / "shard_0000.h5"
    write_shard(path, graphs, cutoff=CUTOFF)
    with pytest.raises(ShardError, match=re.escape(str(path)) + f": graph 4: edge index {bad} "
                       "out of range for its 32 atoms"):
        GraphStore(path)
    assert len(GraphStore(path, check_edges=False)) == 6  # the table alone
    graphs[4]["edge_index"][1, -1] = 31
    write_shard(path, graphs, cutoff=CUTOFF)
    assert len(GraphStore(path)) == 6


# ---------------------------------------------------------------- reading frames


def test_unreadable_frames_name_file_and_frame_and_are_skipped(tmp_path):
    source = tmp_path / "frames_0000.extxyz"
    ase.io.write(source, crystals(4), format="extxyz")
    lines = source.read_text().splitlines(keepends=True)
    per_frame = len(lines) // 4
    lines[2 * per_frame + 2] = "Xx" + lines[2 * per_frame + 2][2:]  # frame 2: unknown symbol
    source.write_text("".join(lines[:-3]))  # frame 3: truncated
    shard = tmp_path / "shard_0000.h5"
    with pytest.raises(InvalidFrameError, match=re.escape(str(source)) + ": frame 2: "):
        build_shard(source, shard, CUTOFF)
    report = build_shard(source, shard, CUTOFF, skip_invalid=True)
    assert report["graphs"] == 2 and report["skipped"] == 2, report
    np.testing.assert_array_equal(h5py.File(shard)["source_index"][:], [0, 1])
    source.write_text("")
    with pytest.raises(ValueError, match=re.escape(str(source)) + ": no frames"):
        build_shard(source, shard, CUTOFF)
