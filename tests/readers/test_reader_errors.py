"""Reader errors name the file, the frame and the reason.

Each case is made from a good extxyz file by editing its text the way real files go bad:
truncated, a column missing, an atom count that does not match, an unknown symbol, an absurd
label, an empty file; a slab with a zero c vector is accepted; a failed re-convert keeps the
previous output.
"""

from __future__ import annotations

import collections
import io
import json
from pathlib import Path

import ase.io
import numpy as np
import pytest
from ase import Atoms
from ase.build import fcc111
from ase.calculators.singlepoint import SinglePointCalculator

from cfmtrain.cli import main as cli_main
from cfmtrain.frames.extxyz import EmptyInputError, read_extxyz_atoms
from cfmtrain.frames.validate import InvalidFrameError, Limits, frame_message
from cfmtrain.shards.convert import convert, convert_own


def labelled(seed: int, energy: float | None = None) -> Atoms:
    atoms = Atoms("CuNi", positions=[[0, 0, 0], [1.8, 1.8, 0]], cell=[3.6, 3.6, 3.6], pbc=True)
    rng = np.random.default_rng(seed)
    atoms.info["REF_energy"] = float(rng.normal()) if energy is None else energy
    atoms.arrays["REF_forces"] = rng.normal(size=(2, 3))
    return atoms


def good_lines() -> list[str]:
    """Three 2-atom frames, 4 lines each: frame k's header is line 4k + 1 (1-based)."""
    text = io.StringIO()
    ase.io.write(text, [labelled(0), labelled(1), labelled(2)], format="extxyz")
    lines = text.getvalue().splitlines(keepends=True)
    assert len(lines) == 12 and lines[4] == "2\n"
    return lines


def write(tmp_path: Path, lines: list[str], name: str = "bad.extxyz") -> Path:
    path = tmp_path / name
    path.write_text("".join(lines))
    return path


def refused(path: Path, tmp_path: Path, **kwargs) -> InvalidFrameError:
    with pytest.raises(InvalidFrameError) as err:
        convert("x", [path], tmp_path / "out", progress=False, **kwargs)
    return err.value


def edited(line: int, new: str) -> list[str]:
    lines = good_lines()
    lines[line] = new
    return lines


FORCES_COLUMNS = ":REF_forces:R:3"

# name -> (lines, frame named, reason, skippable with --skip-invalid)
CASES = {
    "ends mid-frame": (good_lines()[:-1], 2, "truncated frame", True),
    "ends mid-line": (good_lines()[:-1] + [good_lines()[-1][:20]], 2, "truncated frame", True),
    "forces columns missing": (  # Properties declares forces; the rows have none
        [*good_lines()[:6], *(" ".join(r.split()[:4]) + "\n" for r in good_lines()[6:8]),
         *good_lines()[8:]], 1, "wrong number of columns", True),
    "forces undeclared": (  # the rows have forces, Properties does not say so
        edited(5, good_lines()[5].replace(FORCES_COLUMNS, "")), 1, "wrong number of columns",
        True),
    "count larger than rows": (edited(4, "3\n"), 1, "atom count does not match the atom lines",
                               False),
    "count smaller than rows": (edited(4, "1\n"), 1, "atom count does not match the atom lines",
                                False),
    "symbol Xx": (edited(6, good_lines()[6].replace("Cu", "Xx", 1)), 1,
                  "unknown element symbol", True),
    "symbol D": (edited(6, good_lines()[6].replace("Cu", "D ", 1)), 1,
                 "unknown element symbol", True),
    "blank line": ([*good_lines()[:4], "\n", *good_lines()[4:]], 1,
                   "blank line between frames", False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_extxyz_names_file_frame_and_reason(tmp_path, case):
    lines, frame, reason, skippable = CASES[case]
    path = write(tmp_path, lines)
    err = refused(path, tmp_path)
    assert str(err).startswith(f"{path}: frame {frame}: {reason} (")
    assert (err.source, err.index, err.reason) == (str(path), frame, reason)
    assert "line " in str(err)  # and where in the file
    assert not (tmp_path / "out" / "manifest.json").exists()
    if skippable:  # the frame's extent is known: --skip-invalid skips it, counted
        manifest = convert("x", [path], tmp_path / "out", progress=False, skip_invalid=True)
        assert manifest["skipped_by_reason"] == {reason: 1} and manifest["frames"] == 2
        assert manifest["skipped_examples"][0].startswith(f"{path}: frame {frame}: {reason}")
    else:  # the frame boundaries are lost: nothing after them can be trusted
        assert str(refused(path, tmp_path, skip_invalid=True)) == str(err)


def test_symbol_messages_name_the_symbol_and_atom(tmp_path):
    lines, _, _, _ = CASES["symbol D"]
    err = refused(write(tmp_path, lines), tmp_path)
    assert "'D' at atom 0 (line 7) (deuterium: write H)" in str(err)
    lines, _, _, _ = CASES["symbol Xx"]
    assert "'Xx' at atom 0 (line 7)" in str(refused(write(tmp_path, lines), tmp_path))


def test_count_mismatch_names_the_lines(tmp_path):
    err = refused(write(tmp_path, CASES["count larger than rows"][0]), tmp_path)
    assert "line 5 declares 3 atoms, but line 9 among them is '2'" in str(err)
    err = refused(write(tmp_path, CASES["count smaller than rows"][0]), tmp_path)
    assert "line 5 declares 1 atom, but line 8 after them is 'Ni" in str(err)


def test_zip_member_and_own_data_name_the_file(tmp_path):
    import zipfile

    lines, frame, reason, _ = CASES["symbol Xx"]
    src = tmp_path / "set.zip"
    with zipfile.ZipFile(src, "w") as archive:
        archive.writestr("set/a.extxyz", "".join(good_lines()))
        archive.writestr("set/b.extxyz", "".join(lines))
    assert str(refused(src, tmp_path)).startswith(f"{src}:set/b.extxyz: frame {frame}: {reason}")
    own = write(tmp_path, CASES["ends mid-frame"][0], "own.xyz")
    with pytest.raises(InvalidFrameError, match=rf"^{own}: frame 2: truncated frame \("):
        convert_own("x", [own], tmp_path / "own_out", progress=False)


def test_truncated_trajectory_names_file_and_frame(tmp_path):
    frames = []
    for k in range(3):
        atoms = labelled(k)
        atoms.calc = SinglePointCalculator(atoms, energy=-1.0 - k, forces=np.zeros((2, 3)))
        frames.append(atoms)
    whole = tmp_path / "whole.traj"
    ase.io.write(whole, frames)
    cut = tmp_path / "cut.traj"
    cut.write_bytes(whole.read_bytes()[:-100])
    with pytest.raises(InvalidFrameError, match=rf"^{cut}: frame 2: unreadable frame \("):
        convert_own("x", [cut], tmp_path / "out", progress=False)


def test_strict_reader_for_graph_building(tmp_path):
    path = write(tmp_path, good_lines(), "ok.extxyz")
    assert len(list(read_extxyz_atoms(path))) == 3
    bad = write(tmp_path, CASES["symbol Xx"][0])
    with pytest.raises(InvalidFrameError, match=rf"^{bad}: frame 1: unknown element symbol"):
        list(read_extxyz_atoms(bad))
    empty = write(tmp_path, [], "empty.extxyz")
    with pytest.raises(EmptyInputError, match=rf"^{empty}: no frames \(empty file\)"):
        list(read_extxyz_atoms(empty))


# ---------------------------------------------------------------- absurd labels


@pytest.mark.parametrize("energy,reason", [
    ("1e308", "absurd energy"), ("inf", "non-finite energy"), ("nan", "non-finite energy"),
    ("-1e308", "absurd energy")])
def test_absurd_or_non_finite_energy_names_the_frame(tmp_path, energy, reason):
    lines = good_lines()
    lines[5] = lines[5].replace(f"REF_energy={labelled(1).info['REF_energy']!r}",
                                f"REF_energy={energy}")
    assert f"REF_energy={energy}" in lines[5]
    path = write(tmp_path, lines)
    err = refused(path, tmp_path)
    assert str(err).startswith(f"{path}: frame 1: {reason} (")
    manifest = convert("x", [path], tmp_path / "out", progress=False, skip_invalid=True)
    assert manifest["skipped_by_reason"] == {reason: 1}


def test_absurd_force_and_stress_and_configurable_limits(tmp_path):
    frames = [labelled(0), labelled(1, energy=-3e6), labelled(2)]  # -1.5e6 eV/atom
    frames[2].arrays["REF_forces"][1, 2] = -2e4
    path = tmp_path / "big.extxyz"
    ase.io.write(path, frames, format="extxyz")
    err = refused(path, tmp_path)
    assert str(err).startswith(f"{path}: frame 1: absurd energy (energy = -3e+06 eV, 1.5e+06 "
                               "eV/atom; limit 1e+06 eV/atom")
    loose = Limits(max_energy_per_atom=1e7)
    err = refused(path, tmp_path, limits=loose)
    assert str(err).startswith(f"{path}: frame 2: absurd forces (force -20000 eV/A on atom 1 (z)")
    manifest = convert("x", [path], tmp_path / "out", progress=False,
                       limits=Limits(max_energy_per_atom=1e7, max_force=1e5))
    assert manifest["frames"] == 3
    assert manifest["limits"] == {"max_energy_per_atom": 1e7, "max_force": 1e5,
                                  "max_stress": 1e3}
    stressed = labelled(3)
    stressed.info["REF_stress"] = np.eye(3) * 5e3
    assert frame_message(stressed, "f", 0).startswith("f: frame 0: absurd stress (")
    assert frame_message(stressed, "f", 0, limits=Limits(max_stress=1e4)) is None
    with pytest.raises(ValueError, match="max_force must be a positive finite number"):
        Limits(max_force=0)


def test_limits_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "big.extxyz"
    ase.io.write(path, [labelled(0), labelled(1, energy=-3e6)], format="extxyz")
    base = ["convert", "x", "--input", str(path), "--output", str(tmp_path / "o"),
            "--no-progress"]
    assert cli_main(base) == 1
    assert f"error: {path}: frame 1: absurd energy" in capsys.readouterr().err
    assert cli_main([*base, "--max-energy-per-atom", "2e6"]) == 0
    # `cfmtrain graphs` validates under the limits the frames were converted with
    graphs = 0
    for k, frames in enumerate(sorted((tmp_path / "o").glob("frames_*.extxyz"))):
        shard = tmp_path / f"shard_{k}.h5"
        assert cli_main(["graphs", "--input", str(frames), "--output", str(shard)]) == 0
        graphs += json.loads(shard.with_suffix(".json").read_text())["graphs"]
    assert graphs == 2
    assert cli_main([*base, "--max-force", "-1"]) == 1
    assert "max_force must be a positive finite number" in capsys.readouterr().err


# ---------------------------------------------------------------- slabs


def slab_frame() -> Atoms:
    """A Cu(111) slab, periodic in a and b, its c vector zero (as vesin and ASE allow)."""
    slab = fcc111("Cu", size=(3, 3, 3), vacuum=None, periodic=False)
    slab.pbc = [True, True, False]
    slab.cell[2] = 0.0
    slab.info.clear()
    slab.info["REF_energy"] = -3.5 * len(slab)
    slab.arrays["REF_forces"] = np.zeros((len(slab), 3))
    return slab


def test_slab_with_zero_c_vector_is_accepted_and_its_graph_built(tmp_path):
    from ase.neighborlist import neighbor_list

    from cfmtrain.graphs.build import build_graphs

    slab = slab_frame()
    assert frame_message(slab, "f", 0) is None
    path = tmp_path / "slab.extxyz"
    ase.io.write(path, [slab], format="extxyz")
    out = tmp_path / "out"
    assert convert("x", [path], out, progress=False)["frames"] == 1
    (frame,) = ase.io.read(out / "frames_0000.extxyz", index=":")
    assert list(frame.pbc) == [True, True, False] and not frame.cell[2].any()
    (graph,) = build_graphs([frame], str(path), 4.5, False, collections.Counter())
    i, j, shifts = neighbor_list("ijS", slab, 4.5)
    assert graph["edge_index"].shape[1] == len(i) > 0
    ours = sorted(zip(*graph["edge_index"].tolist(), map(tuple, graph["unit_shifts"].tolist()),
                      strict=True))
    assert ours == sorted(zip(i.tolist(), j.tolist(), map(tuple, shifts.tolist()), strict=True))


def test_singular_periodic_vectors_still_refused():
    slab = slab_frame()
    slab.pbc = True  # c periodic but zero
    assert "singular cell with periodic boundaries (|det(cell)| = 0 A^3" in frame_message(
        slab, "f", 0)
    flat = slab_frame()
    flat.cell[1] = flat.cell[0] * 2  # a and b parallel: no area
    assert "singular cell with periodic boundaries (area of the periodic vectors = 0 A^2" in (
        frame_message(flat, "f", 0))
    wire = slab_frame()
    wire.pbc = [False, True, False]
    wire.cell[1] = 0.0
    assert "(length of the periodic vector = 0 A" in frame_message(wire, "f", 0)


# ---------------------------------------------------------------- empty input


def test_empty_input_file_is_refused_by_name(tmp_path, capsys):
    empty = write(tmp_path, [], "empty.extxyz")
    good = write(tmp_path, good_lines(), "good.extxyz")
    for inputs in ([empty], [good, empty]):
        with pytest.raises(EmptyInputError, match=rf"^{empty}: no frames \(empty file\)$"):
            convert("x", inputs, tmp_path / "out", progress=False)
        with pytest.raises(EmptyInputError, match=rf"^{empty}: no frames"):
            convert_own("x", inputs, tmp_path / "own", progress=False)
    blank = write(tmp_path, ["\n", "  \n"], "blank.xyz")
    with pytest.raises(EmptyInputError, match=rf"^{blank}: no frames \(only blank lines\)$"):
        convert("x", [blank], tmp_path / "out", progress=False)
    assert cli_main(["convert", "x", "--input", str(empty), "--output", str(tmp_path / "o"),
                     "--no-progress"]) == 1
    assert capsys.readouterr().err == f"error: {empty}: no frames (empty file)\n"


def test_fewer_frames_than_shards_is_refused(tmp_path):
    good = write(tmp_path, good_lines(), "good.extxyz")
    with pytest.raises(ValueError, match=r"3 valid frame\(s\) for 4 shards"):
        convert("x", [good], tmp_path / "out", num_shards=4, progress=False)
    assert convert("x", [good], tmp_path / "out", num_shards=3,
                   progress=False)["frames_per_shard"] == [1, 1, 1]


# ---------------------------------------------------------------- re-convert


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_failed_reconvert_keeps_the_previous_output(tmp_path):
    src = write(tmp_path, good_lines(), "in.extxyz")
    out = tmp_path / "out"
    convert("x", [src], out, num_shards=3, progress=False)
    before = snapshot(out)
    for bad in (CASES["symbol Xx"][0], CASES["count larger than rows"][0], []):
        write(tmp_path, bad, "in.extxyz")
        with pytest.raises(ValueError):  # InvalidFrameError and EmptyInputError both are
            convert("x", [src], out, num_shards=3, progress=False)
        assert snapshot(out) == before  # no staging folder or temporary file left either
    write(tmp_path, good_lines()[:8], "in.extxyz")  # a good re-convert into fewer shards
    manifest = convert("x", [src], out, num_shards=2, progress=False)
    assert sorted(snapshot(out)) == ["frames_0000.extxyz", "frames_0001.extxyz", "manifest.json"]
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_failed_own_reconvert_keeps_the_previous_output(tmp_path):
    src = write(tmp_path, good_lines(), "in.xyz")
    out = tmp_path / "out"
    convert_own("x", [src], out, e0s='{"Cu": -1.0, "Ni": -2.0}', progress=False)
    before = snapshot(out)
    assert "e0s.json" in before
    write(tmp_path, CASES["ends mid-frame"][0], "in.xyz")
    with pytest.raises(InvalidFrameError):
        convert_own("x", [src], out, e0s="fit", progress=False)
    assert snapshot(out) == before
    write(tmp_path, good_lines(), "in.xyz")
    with pytest.raises(ValueError, match="no E0 for Ni"):  # fails after the shards are written
        convert_own("x", [src], out, e0s='{"Cu": -1.0}', progress=False)
    assert snapshot(out) == before
    convert_own("x", [src], out, e0s="fit", progress=False)  # fit: no e0s.json any more
    assert sorted(snapshot(out)) == ["frames_0000.extxyz", "manifest.json"]
