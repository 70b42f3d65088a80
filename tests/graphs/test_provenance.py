"""Provenance checked on use: each graph shard records its data set, cutoff and inputs, each
split the store it splits, each checkpoint the store and split it trained on. A shard of
another data set, a split of other graphs, graphs at another cutoff and a resume onto changed
data are refused or started afresh, saying why; a corrupt split names its file."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import ase.io
import helpers
import pytest
import torch
from helpers import emt_frames

from cfmtrain.cli import main
from cfmtrain.graphs.build import build_shard
from cfmtrain.graphs.split import SplitError, read_split
from cfmtrain.graphs.store import GraphStore, ShardError
from cfmtrain.shards.convert import convert

CUTOFF = 4.0


def build_set(root: Path, name: str, frames: list, shards: int = 1) -> Path:
    """`cfmtrain convert` then `cfmtrain graphs` of each shard, as the workflow runs them:
    results/data/<name>/frames -> results/graphs/<name>; returns the graph folder."""
    source = root / f"{name}.xyz"
    root.mkdir(parents=True, exist_ok=True)
    ase.io.write(source, frames)
    frames_dir = root / "data" / name / "frames"
    convert(name, [source], frames_dir, shards, progress=False)
    graphs = root / "graphs" / name
    for k in range(shards):
        build_shard(frames_dir / f"frames_{k:04d}.extxyz", graphs / f"shard_{k:04d}.h5", CUTOFF,
                    dataset=name)
    return graphs


def split(graphs: Path, out: Path, *extra: str) -> Path:
    assert main(["split", "--graphs", str(graphs), "--output", str(out), *extra]) == 0
    return out


def train(graphs: Path, split_path: Path, out: Path, *extra: str, resume: str | None = None,
          cutoff: float | None = CUTOFF) -> int:
    return helpers.train(graphs, split_path, out, "variant=baseline", "epochs=1", *extra,
                         resume=resume, cutoff=cutoff)


def shifted(frames: list, by: float) -> list:
    out = []
    for atoms in frames:
        atoms = atoms.copy()
        atoms.info["REF_energy"] += by * len(atoms)
        out.append(atoms)
    return out


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("sets")
    frames = emt_frames(24, seed=3)
    return root, frames, build_set(root, "cu", frames, shards=2)


def test_shards_record_their_origin_and_the_store_its_fingerprint(sets):
    root, frames, graphs = sets
    store = GraphStore(graphs)
    assert store.datasets() == ["cu", "cu"]
    origin = store.origins[0]
    assert origin["cutoff"] == CUTOFF and origin["frames"] == "frames_0000.extxyz"
    manifest = root / "data/cu/frames/manifest.json"
    assert origin["inputs_sha256"] is not None and manifest.is_file()
    assert len({o["id"] for o in store.origins}) == 2 and len(store.fingerprint) == 64
    assert GraphStore(graphs).fingerprint == store.fingerprint


def test_a_shard_of_another_data_set_is_refused_by_name(sets, tmp_path):
    root, frames, graphs = sets
    other = build_set(tmp_path, "ni", emt_frames(9, seed=7))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "shard_0000.h5").write_bytes((graphs / "shard_0000.h5").read_bytes())
    (mixed / "shard_0001.h5").write_bytes((other / "shard_0000.h5").read_bytes())
    with pytest.raises(ShardError, match=r"shard_0001.h5: built from data set 'ni'.*"
                                         r"shard_0000.h5 beside it from 'cu'"):
        GraphStore(mixed)


def test_the_split_records_its_store_and_its_fractions(sets, tmp_path, capsys):
    _, _, graphs = sets
    path = split(graphs, tmp_path / "split.npz", "--valid", "0.2", "--test", "0.1")
    out = capsys.readouterr().out
    parts, meta = read_split(path)
    assert meta["store"] == GraphStore(graphs).fingerprint and meta["cutoff"] == CUTOFF
    assert meta["requested"] == [0.2, 0.1]
    total = sum(len(v) for v in parts.values())
    assert meta["realised"] == pytest.approx([len(parts[p]) / total
                                              for p in ("train", "valid", "test")])
    assert f"valid {len(parts['valid'])} (" in out and "requested valid 20%, test 10%" in out


def test_a_split_of_other_graphs_is_refused(sets, tmp_path, capsys):
    """The other set has as many graphs (indices in range) but other energies."""
    root, frames, graphs = sets
    other = build_set(tmp_path, "cu", shifted(frames, 0.01), shards=2)
    foreign = split(other, tmp_path / "foreign.npz")
    assert train(graphs, foreign, tmp_path / "run") == 2
    assert f"{foreign}: made for other graphs" in capsys.readouterr().err


def test_graphs_built_at_another_cutoff_are_refused(sets, tmp_path, capsys):
    _, _, graphs = sets
    path = split(graphs, tmp_path / "split.npz")
    assert train(graphs, path, tmp_path / "run", cutoff=5.0) == 2
    assert "graphs built at cutoff 4.0 A, the config asks for 5.0 A" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncated", "garbage", "no test part"])
def test_a_corrupt_split_names_its_file(sets, tmp_path, capsys, damage):
    _, _, graphs = sets
    path = split(graphs, tmp_path / "split.npz")
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 3])
    elif damage == "garbage":
        path.write_bytes(b"\x00" * 64)
    else:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("train.npy", b"")
    with pytest.raises(SplitError, match=rf"{path}: unreadable, truncated or not a split"):
        read_split(path)
    assert train(graphs, path, tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert f"{path}: unreadable, truncated or not a split" in err and "delete it" in err


@pytest.mark.slow
def test_resume_onto_changed_data_starts_afresh_saying_why(sets, tmp_path, capsys):
    """A run stopped after two steps; then every energy of its data set shifts and its graphs
    and split are rebuilt: --resume auto starts afresh (new statistics, no old steps), and an
    explicit --resume of the old checkpoint is refused."""
    root, frames, _ = sets
    graphs = build_set(tmp_path / "a", "cu", frames)
    path = split(graphs, tmp_path / "split.npz")
    out = tmp_path / "run"
    assert train(graphs, path, out, "max_steps=2") == 0
    old = torch.load(out / "checkpoint.pt", weights_only=True)
    assert old["global_step"] == 2 and old["data"]["store"] == GraphStore(graphs).fingerprint
    kept = tmp_path / "old.pt"
    kept.write_bytes((out / "checkpoint.pt").read_bytes())

    graphs = build_set(tmp_path / "a", "cu", shifted(frames, 0.05))  # the same paths, rebuilt
    path = split(graphs, tmp_path / "split.npz")
    capsys.readouterr()
    assert train(graphs, path, out, resume="auto") == 0
    err = capsys.readouterr().err
    assert "not resumed, its training data changed" in err and "resuming at" not in err
    new = json.loads((out / "summary.json").read_text())
    assert new["resumed_epochs"] == []
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["data"]["store"] == GraphStore(graphs).fingerprint != old["data"]["store"]
    assert state["stats"]["e0s"] != old["stats"]["e0s"]  # E0s of the new labels

    assert train(graphs, path, tmp_path / "run2", resume=str(kept)) == 2
    assert f"{kept}: trained on other data" in capsys.readouterr().err


def test_an_edgeless_training_set_is_refused_naming_the_cutoff(tmp_path, capsys):
    """Graphs written without the build's check (e.g. by hand): statistics refuse a training set
    without a single edge rather than train to a non-finite loss."""
    from cfmtrain.graphs.build import atoms_to_graph
    from cfmtrain.graphs.store import write_shard

    frames = emt_frames(9, seed=1)
    graphs = []
    for i, atoms in enumerate(frames):
        g = atoms_to_graph(atoms, 1.0)
        g["source_index"] = i
        graphs.append(g)
    folder = tmp_path / "store"
    write_shard(folder / "shard_0000.h5", graphs, cutoff=1.0)
    path = split(folder, tmp_path / "split.npz")
    assert train(folder, path, tmp_path / "run", cutoff=None) == 2
    err = capsys.readouterr().err
    assert "the training graphs have no edges at all: the cutoff 1.0 A" in err
    assert not (tmp_path / "run" / "summary.json").exists()


def test_frames_of_one_file_listed_twice_are_read_once(tmp_path, recwarn):
    frames = emt_frames(6, seed=2)
    source = tmp_path / "a" / "x.xyz"
    source.parent.mkdir()
    ase.io.write(source, frames)
    (tmp_path / "link.xyz").symlink_to(source)
    (tmp_path / "copy.xyz").write_bytes(source.read_bytes())
    manifest = convert("set", [source, tmp_path / "a" / ".." / "a" / "x.xyz",
                               tmp_path / "link.xyz", tmp_path / "copy.xyz"],
                       tmp_path / "out", progress=False)
    assert manifest["frames"] == 6 and [s["path"] for s in manifest["sources"]] == [str(source)]
    said = [str(w.message) for w in recwarn]
    assert any("link.xyz: the same file as" in m for m in said)
    assert any("copy.xyz: the same content as" in m for m in said)
    assert any("x.xyz: the same file as" in m and ".." in m for m in said)
