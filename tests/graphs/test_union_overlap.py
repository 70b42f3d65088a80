"""A union's members that share structures: the split of the union counts each structure once
(the first member listed keeps it) and warns naming both members and the input files they share,
so that no structure is in two parts; a member listed twice is refused before any job."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import ase.io
import numpy as np
import pytest
from helpers import REPO, emt_frames

from cfmtrain.graphs import split
from cfmtrain.graphs.build import build_shard
from cfmtrain.graphs.store import GraphStore
from cfmtrain.graphs.structure_keys import first_holders, structure_keys
from cfmtrain.shards.convert import convert_own


def member(root: Path, name: str, files: list[Path]) -> Path:
    """A member's graph store built from its own files, as the workflow builds it."""
    frames = root / "data" / name / "frames"
    convert_own(name, files, frames, progress=False)
    graphs = root / "graphs" / name
    build_shard(frames / "frames_0000.extxyz", graphs / "shard_0000.h5", 4.0, dataset=name)
    return graphs


def split_union(folders: list[Path], output: Path, capsys) -> tuple[dict, str]:
    parser = argparse.ArgumentParser()
    split.add_arguments(parser)
    args = parser.parse_args(["--graphs", *map(str, folders), "--output", str(output),
                              "--valid", "0.2", "--test", "0.2", "--seed", "3"])
    assert split.run(args) == 0
    return split.read_split(output), capsys.readouterr().err


def disjoint_structures(store: GraphStore, parts: dict) -> None:
    first = first_holders(structure_keys(store))
    seen = {name: {int(first[i]) for i in idx} for name, idx in parts.items()}
    assert not seen["train"] & seen["test"] and not seen["train"] & seen["valid"]
    assert not seen["valid"] & seen["test"]


def test_structures_in_two_members_are_split_once(tmp_path, capsys):
    """Two members whose files differ but hold 8 of the same frames (written in another order
    among other frames): the later member's copies leave the split, named in a warning."""
    frames = emt_frames(24, seed=5)
    ase.io.write(tmp_path / "first.xyz", frames[:14])
    ase.io.write(tmp_path / "second.extxyz", frames[6:14][::-1] + frames[14:])
    a = member(tmp_path, "first", [tmp_path / "first.xyz"])
    b = member(tmp_path, "second", [tmp_path / "second.extxyz"])
    (parts, meta), err = split_union([a, b], tmp_path / "split.npz", capsys)
    store = GraphStore([a, b])
    assert len(store) == 32 and int(meta["left_out"]) == 8
    assert sum(map(len, parts.values())) == 24
    disjoint_structures(store, parts)
    assert f"union members {a} and {b} share 8 structure(s)" in err
    assert f"the copies in {b} are left out of the split" in err
    assert "input file" not in err  # no file in common: only structures
    # the later member split alone keeps every graph: it holds no structure twice
    alone = argparse.Namespace(graphs=[b], output=tmp_path / "b.npz", valid=0.2, test=0.2, seed=3)
    assert split.run(alone) == 0
    assert sum(map(len, split.load_split(tmp_path / "b.npz").values())) == 18


def test_a_file_two_members_read_is_named_and_split_once(tmp_path, capsys):
    """The second member reads the first's file through a symbolic link among its own: its
    frames leave the split, and the warning names the file under both names."""
    frames = emt_frames(20, seed=9)
    (tmp_path / "lab").mkdir()
    ase.io.write(tmp_path / "lab/shared.xyz", frames[:9])
    ase.io.write(tmp_path / "lab/own.xyz", frames[9:])
    os.symlink(tmp_path / "lab/shared.xyz", tmp_path / "linked.xyz")
    a = member(tmp_path, "lab", [tmp_path / "lab/shared.xyz"])
    b = member(tmp_path, "group", [tmp_path / "linked.xyz", tmp_path / "lab/own.xyz"])
    (parts, meta), err = split_union([a, b], tmp_path / "split.npz", capsys)
    assert int(meta["left_out"]) == 9 and sum(map(len, parts.values())) == 20
    disjoint_structures(GraphStore([a, b]), parts)
    assert (f"from the input file(s) {tmp_path / 'linked.xyz'} (the same content as "
            f"{tmp_path / 'lab/shared.xyz'})") in err


def test_members_without_shared_structures_split_as_before(tmp_path, capsys):
    frames = emt_frames(18, seed=2)
    ase.io.write(tmp_path / "x.xyz", frames[:9])
    ase.io.write(tmp_path / "y.xyz", frames[9:])
    folders = [member(tmp_path, "x", [tmp_path / "x.xyz"]),
               member(tmp_path, "y", [tmp_path / "y.xyz"])]
    (parts, meta), err = split_union(folders, tmp_path / "split.npz", capsys)
    store = GraphStore(folders)
    expected = split.split_indices(store.subsets, (0.2, 0.2), 3, store.num_atoms)
    assert all(np.array_equal(parts[p], expected[p]) for p in split.PARTS)
    assert int(meta["left_out"]) == 0 and "warning" not in err


@pytest.mark.workflow
def test_a_member_listed_twice_is_refused_by_the_dry_run(tmp_path):
    import subprocess
    import sys

    root = REPO
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("datasets:\n  other: {kind: generated, scale: 0.05, seed: 1, shards: 1}\n"
                       "  both: {kind: union, members: [mini, other, mini]}\n"
                       "targets: [both]\n")
    result = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--configfile",
                             str(overlay)], cwd=root, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "config datasets.both.members: 'mini' is listed 2 times" in result.stdout + result.stderr
