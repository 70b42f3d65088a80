"""A conversion in parallel parts writes the same shards as in one process: registered and own
data, files cut into frame ranges, skipped frames, the first invalid frame's error, E0s from
isolated atoms; and the offsets of the scan that cuts a file."""

from __future__ import annotations

import json

import ase.db
import ase.io
import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk

from cfmtrain.frames.extxyz import EmptyInputError, frame_offsets, iter_extxyz_file
from cfmtrain.frames.validate import InvalidFrameError
from cfmtrain.readers.options import ReadOptions
from cfmtrain.shards import parts
from cfmtrain.shards.convert import convert, convert_own

KEYS = ReadOptions("REF_energy", "REF_forces", "REF_stress")


def frames(count: int, seed: int) -> list[Atoms]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        atoms = bulk("Cu", "fcc", a=3.6).repeat((1 + i % 3, 1, 1))
        atoms.rattle(0.05, seed=seed * 1000 + i)
        atoms.info["REF_energy"] = float(rng.normal(-3.5 * len(atoms), 0.1))
        atoms.arrays["REF_forces"] = rng.normal(size=(len(atoms), 3))
        atoms.info["REF_stress"] = rng.normal(size=6) * 0.01
        atoms.info["config_type"] = f"t{i % 2}"
        out.append(atoms)
    return out


def shard_texts(folder, shards: int) -> list[str]:
    return [(folder / f"frames_{k:04d}.extxyz").read_text() for k in range(shards)]


@pytest.fixture
def inputs(tmp_path):
    ase.io.write(tmp_path / "a.extxyz", frames(41, 1), format="extxyz")
    ase.io.write(tmp_path / "b.extxyz", frames(9, 2), format="extxyz")
    with ase.db.connect(tmp_path / "c.db") as db:
        for atoms in frames(5, 3):
            db.write(atoms, data={"REF_forces": atoms.arrays["REF_forces"]},
                     REF_energy=atoms.info["REF_energy"])
    return tmp_path


@pytest.mark.slow
def test_registered_data_in_parts_equals_one_process(inputs, monkeypatch):
    monkeypatch.setattr(parts, "PART_FRAMES", 6)  # a.extxyz in 7 parts, b in 2
    files = [inputs / "a.extxyz", inputs / "b.extxyz"]
    plan = parts.plan_parts(files, 3, lambda p: p.suffix == ".extxyz")
    assert [(p.path.name, p.first, p.count) for p in plan][:2] == [("a.extxyz", 0, 6),
                                                                    ("a.extxyz", 6, 6)]
    assert len(plan) == 9 and plan[6].count is None and plan[-1].count is None
    one = convert("x", files, inputs / "one", 4, KEYS, progress=False)
    many = convert("x", files, inputs / "many", 4, KEYS, progress=False, workers=3)
    assert shard_texts(inputs / "one", 4) == shard_texts(inputs / "many", 4)
    assert one["frames"] == many["frames"] == 50
    assert one["frames_per_shard"] == many["frames_per_shard"] == [13, 13, 12, 12]
    assert not (inputs / "many" / ".parts").exists()


@pytest.mark.slow
def test_skipped_frames_and_the_first_error_are_the_same(inputs, monkeypatch):
    monkeypatch.setattr(parts, "PART_FRAMES", 5)
    bad = frames(23, 4)
    for i in (7, 16):  # in the second and fourth parts
        bad[i].arrays["REF_forces"][0, 0] = np.nan
    ase.io.write(inputs / "bad.extxyz", bad, format="extxyz")
    results = [convert("x", [inputs / "bad.extxyz"], inputs / f"s{w}", 2, KEYS,
                       skip_invalid=True, progress=False, workers=w) for w in (1, 2)]
    for key in ("frames", "frames_per_shard", "skipped", "skipped_by_reason",
                "skipped_examples"):
        assert results[0][key] == results[1][key], key
    assert results[0]["skipped"] == 2
    assert shard_texts(inputs / "s1", 2) == shard_texts(inputs / "s2", 2)
    errors = []
    for w in (1, 2):
        with pytest.raises(InvalidFrameError) as err:
            convert("x", [inputs / "bad.extxyz"], inputs / f"e{w}", 2, KEYS, progress=False,
                    workers=w)
        errors.append(str(err.value))
    assert errors[0] == errors[1] and "frame 7" in errors[0]


@pytest.mark.slow
def test_own_data_in_parts_equals_one_process(inputs, monkeypatch):
    monkeypatch.setattr(parts, "PART_FRAMES", 4)
    mixed = frames(13, 5)
    for i in (2, 9):  # isolated atoms, in two parts: the E0s come from both
        symbol = "Cu" if i == 2 else "Ni"
        mixed[i] = Atoms(symbol, positions=[[0, 0, 0]])
        mixed[i].info.update(REF_energy=-0.5 if i == 2 else -0.7, config_type="IsolatedAtom")
        mixed[i].arrays["REF_forces"] = np.zeros((1, 3))
    mixed[5] = bulk("NiCu", "rocksalt", a=3.6)
    mixed[5].info.update(REF_energy=-7.0)
    mixed[5].arrays["REF_forces"] = np.zeros((2, 3))
    ase.io.write(inputs / "own.extxyz", mixed, format="extxyz")
    files = [inputs / "own.extxyz", inputs / "c.db"]
    manifests = [convert_own("mine", files, inputs / f"o{w}", 3, e0s="isolated",
                             progress=False, workers=w) for w in (1, 3)]
    assert shard_texts(inputs / "o1", 3) == shard_texts(inputs / "o3", 3)
    assert manifests[0]["isolated_atoms"] == manifests[1]["isolated_atoms"] == 2
    e0s = [json.loads((inputs / f"o{w}" / "e0s.json").read_text()) for w in (1, 3)]
    assert e0s[0] == e0s[1]
    assert manifests[0]["frames"] == 11 + 5


def test_offsets_start_the_frames_they_name(tmp_path):
    written = frames(17, 6)
    path = tmp_path / "f.extxyz"
    ase.io.write(path, written, format="extxyz")
    offsets = frame_offsets(path, 5)
    assert [o[0] for o in offsets] == [0, 5, 10, 15]
    lines = path.read_text().splitlines()
    for first, offset, line in offsets:
        [(index, atoms, problem)] = list(iter_extxyz_file(path, first, offset, line, count=1))
        assert problem is None and index == first
        np.testing.assert_allclose(atoms.positions, written[first].positions, atol=1e-6)
        assert int(lines[line]) == len(written[first])  # `line` lines come before it
    (tmp_path / "cut.extxyz").write_text("\n".join(lines[:40] + ["oops"] + lines[40:]) + "\n")
    assert len(frame_offsets(tmp_path / "cut.extxyz", 1)) < len(written)  # stops at the cut


@pytest.mark.slow
def test_an_empty_file_in_a_worker_is_named(inputs):
    (inputs / "empty.extxyz").write_text("")
    with pytest.raises(EmptyInputError, match="empty.extxyz: no frames"):
        convert("x", [inputs / "a.extxyz", inputs / "empty.extxyz"], inputs / "out", 2, KEYS,
                progress=False, workers=2)
    assert not (inputs / "out" / "frames_0000.extxyz").exists()
