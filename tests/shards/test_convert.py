"""Converters: MPtrj JSON (published schema), extxyz, zip of extxyz, ASE db; frame validation.

Expected values are computed by hand from the fixtures, independently of the converter.
"""

from __future__ import annotations

import gzip
import json
import zipfile

import ase.db
import ase.io
import numpy as np
import pytest
from ase import Atoms
from ase.calculators.singlepoint import SinglePointCalculator

from cfmtrain.cli import main as cli_main
from cfmtrain.digest import file_digest
from cfmtrain.frames.validate import (
    InvalidFrameError,
    atoms_problem,
    atoms_problems,
    frame_message,
    validate_atoms,
)
from cfmtrain.readers.mptrj import read_mptrj
from cfmtrain.readers.options import ReadOptions
from cfmtrain.shards.convert import convert
from cfmtrain.shards.sources import stamp

KBAR_TO_EV_A3 = 0.1 / 160.21766208  # 1 kBar = 0.1 GPa; 1 eV/A^3 = 160.21766208 GPa
ATOL = 1e-7  # extxyz writes positions and forces with 8 decimals


# ---------------------------------------------------------------- MPtrj fixture


def _site(element: str, abc: list[float], cell: np.ndarray, with_xyz: bool = True) -> dict:
    site = {"species": [{"element": element, "occu": 1}], "abc": abc,
            "label": element, "properties": {"magmom": 0.0}}
    if with_xyz:
        site["xyz"] = (np.asarray(abc) @ cell).tolist()
    return site


def _structure(cell: list[list[float]], sites: list[tuple[str, list[float]]],
               xyz: bool = True) -> dict:
    m = np.asarray(cell)
    lengths = np.linalg.norm(m, axis=1)
    return {
        "@module": "pymatgen.core.structure", "@class": "Structure", "charge": 0,
        "lattice": {"matrix": cell, "pbc": [True, True, True], "a": lengths[0],
                    "b": lengths[1], "c": lengths[2], "alpha": 60.0, "beta": 60.0,
                    "gamma": 60.0, "volume": abs(np.linalg.det(m))},
        "properties": {},
        "sites": [_site(el, abc, m, xyz) for el, abc in sites],
    }


def _record(mp_id: str, structure: dict, e_unc: float, e_cor: float, forces, stress,
            magmom) -> dict:
    n = len(structure["sites"])
    return {"structure": structure, "uncorrected_total_energy": e_unc,
            "corrected_total_energy": e_cor, "energy_per_atom": e_cor / n,
            "ef_per_atom": -0.5, "e_per_atom_relaxed": e_cor / n, "ef_per_atom_relaxed": -0.5,
            "force": forces, "stress": stress, "magmom": magmom, "bandgap": 0.0,
            "mp_id": mp_id}


CU_CELL = [[0.0, 1.805, 1.805], [1.805, 0.0, 1.805], [1.805, 1.805, 0.0]]  # 1-atom fcc Cu
NACL_CELL = [[5.64, 0.0, 0.0], [0.0, 5.64, 0.0], [0.0, 0.0, 5.64]]
FEO_CELL = [[3.0, 0.1, 0.0], [0.2, 3.1, 0.0], [0.0, 0.3, 4.0]]


def mptrj_fixture() -> dict:
    """Three materials, five frames, in the published schema (stress in kBar, VASP sign)."""
    cu = _structure(CU_CELL, [("Cu", [0.0, 0.0, 0.0])])
    nacl = _structure(NACL_CELL, [("Na", [0.0, 0.0, 0.0]), ("Cl", [0.5, 0.5, 0.5])])
    feo = _structure(FEO_CELL, [("Fe", [0.0, 0.0, 0.0]), ("O", [0.5, 0.5, 0.5]),
                                ("O", [0.25, 0.75, 0.1])], xyz=False)  # positions from abc
    stress_a = [[12.5, 0.3, -0.2], [0.3, 11.0, 0.1], [-0.2, 0.1, 10.0]]
    stress_b = [[-40.0, 0.0, 0.0], [0.0, -40.0, 0.0], [0.0, 0.0, -41.0]]
    return {
        "mp-30": {
            "mp-30-0-0": _record("mp-30", cu, -3.70, -3.71, [[0.0, 0.0, 0.0]], stress_a,
                                 [0.01]),
            "mp-30-0-1": _record("mp-30", cu, -3.72, -3.73, [[0.0, 0.0, 0.0]], stress_b,
                                 [0.0]),
        },
        "mp-22862": {
            "mp-22862-1-0": _record("mp-22862", nacl, -6.9, -7.1,
                                    [[0.01, -0.02, 0.03], [-0.01, 0.02, -0.03]], stress_a,
                                    None),
        },
        "mp-18905": {
            "mp-18905-2-0": _record("mp-18905", feo, -20.5, -22.0,
                                    [[0.1, 0.2, 0.3], [-0.1, -0.1, -0.1], [0.0, -0.1, -0.2]],
                                    stress_b, [3.5, 0.1, 0.1]),
            "mp-18905-2-1": _record("mp-18905", feo, -20.6, -22.1,
                                    [[0.0, 0.0, 0.1], [0.0, 0.0, -0.1], [0.0, 0.0, 0.0]],
                                    stress_a, [3.6, 0.1, 0.1]),
        },
    }


@pytest.fixture
def mptrj_file(tmp_path):
    path = tmp_path / "MPtrj_2022.9_full.json"
    path.write_text(json.dumps(mptrj_fixture()))
    return path


def read_shards(folder, k: int) -> list[list[Atoms]]:
    return [ase.io.read(folder / f"frames_{i:04d}.extxyz", index=":") for i in range(k)]


def test_mptrj_conversion_matches_hand_computed_values(mptrj_file, tmp_path):
    out = tmp_path / "out"
    manifest = convert("mptrj", [mptrj_file], out, num_shards=2, progress=False)
    shards = read_shards(out, 2)
    assert [len(s) for s in shards] == [3, 2] == manifest["frames_per_shard"]
    frames = [shards[i % 2][i // 2] for i in range(5)]  # undo the round robin
    records = [(mp, fid, r) for mp, fr in mptrj_fixture().items() for fid, r in fr.items()]
    for atoms, (mp_id, frame_id, rec) in zip(frames, records, strict=True):
        cell = np.asarray(rec["structure"]["lattice"]["matrix"])
        abc = np.array([s["abc"] for s in rec["structure"]["sites"]])
        symbols = [s["species"][0]["element"] for s in rec["structure"]["sites"]]
        assert atoms.get_chemical_symbols() == symbols
        np.testing.assert_allclose(atoms.cell.array, cell, atol=ATOL)
        np.testing.assert_allclose(atoms.positions, abc @ cell, atol=ATOL)
        assert atoms.pbc.all()
        assert atoms.info["REF_energy"] == rec["uncorrected_total_energy"]
        np.testing.assert_allclose(atoms.arrays["REF_forces"], rec["force"], atol=ATOL)
        expected_stress = -np.asarray(rec["stress"]) * KBAR_TO_EV_A3
        np.testing.assert_allclose(atoms.info["REF_stress"], expected_stress, rtol=1e-12)
        assert atoms.info["config_type"] == "mptrj"
        assert atoms.info["mp_id"] == mp_id and atoms.info["mptrj_id"] == frame_id
    # 1-atom Cu cell, compressive VASP stress (positive kBar) -> negative ASE stress
    assert len(frames[0]) == 1 and frames[0].info["REF_stress"][0, 0] < 0
    assert frames[0].info["REF_stress"][0, 0] == pytest.approx(-12.5 * 0.1 / 160.21766208)
    np.testing.assert_allclose(frames[3].arrays["REF_magmoms"], [3.5, 0.1, 0.1])
    assert manifest["sources"] == [{"path": str(mptrj_file), "bytes": mptrj_file.stat().st_size,
                                    "sha256": file_digest(mptrj_file),
                                    "stamp": stamp(mptrj_file), "frames": 5}]
    assert manifest["skipped"] == 0 and manifest["frames"] == 5
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_mptrj_corrected_energy_and_gzip(mptrj_file, tmp_path):
    gz = tmp_path / "mptrj.json.gz"
    gz.write_bytes(gzip.compress(mptrj_file.read_bytes()))
    opts = ReadOptions("corrected_total_energy", "force", "stress", "kBar-vasp")
    convert("mptrj", [gz], tmp_path / "out", opts=opts, progress=False)
    frames = ase.io.read(tmp_path / "out" / "frames_0000.extxyz", index=":")
    assert [a.info["REF_energy"] for a in frames] == [-3.71, -3.73, -7.1, -22.0, -22.1]


def test_mptrj_is_streamed(mptrj_file):
    # Truncated after the first material: a streaming reader yields its frames, then fails.
    text = mptrj_file.read_text()
    mptrj_file.write_text(text[: text.index('"mp-22862"') + 20])
    frames = read_mptrj(mptrj_file)
    assert [f.index for f in (next(frames), next(frames))] == ["mp-30-0-0", "mp-30-0-1"]
    with pytest.raises(ValueError, match=f"{mptrj_file}: invalid JSON after material"):
        next(frames)


def test_mptrj_bad_record_names_file_and_frame(mptrj_file, tmp_path):
    data = mptrj_fixture()
    del data["mp-22862"]["mp-22862-1-0"]["force"]
    mptrj_file.write_text(json.dumps(data))
    with pytest.raises(InvalidFrameError) as err:
        convert("mptrj", [mptrj_file], tmp_path / "out", progress=False)
    assert str(err.value) == f"{mptrj_file}: frame mp-22862-1-0: missing forces"
    assert list((tmp_path / "out").iterdir()) == []
    manifest = convert("mptrj", [mptrj_file], tmp_path / "out", skip_invalid=True,
                       progress=False)
    assert manifest["frames"] == 4 and manifest["skipped_by_reason"] == {"missing forces": 1}


# ---------------------------------------------------------------- ASE formats


def labelled(symbols: str, positions, cell=None, pbc=False, seed: int = 0) -> Atoms:
    """Atoms with energy/forces/stress as an ASE SinglePointCalculator (ASE's own keys)."""
    rng = np.random.default_rng(seed)
    atoms = Atoms(symbols, positions=positions, cell=cell, pbc=pbc)
    atoms.calc = SinglePointCalculator(atoms, energy=float(rng.normal()),
                                       forces=rng.normal(size=(len(atoms), 3)),
                                       stress=rng.normal(size=6) * 0.01)
    return atoms


def sample_frames() -> list[Atoms]:
    return [
        labelled("Cu", [[0, 0, 0]], cell=np.array(CU_CELL), pbc=True, seed=1),
        labelled("H2O", [[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]], seed=2),
        labelled("NiCu", [[0, 0, 0], [1.8, 1.8, 0]], cell=[3.6, 3.6, 3.6], pbc=True, seed=3),
    ]


def expected_labels(atoms: Atoms, factor: float = 1.0):
    from ase.stress import voigt_6_to_full_3x3_stress

    r = atoms.calc.results
    return r["energy"], r["forces"], voigt_6_to_full_3x3_stress(r["stress"]) * factor


def check_round_trip(originals: list[Atoms], converted: list[Atoms], factor: float = 1.0):
    assert len(converted) == len(originals)
    for a, b in zip(originals, converted, strict=True):
        energy, forces, stress = expected_labels(a, factor)
        assert b.get_chemical_symbols() == a.get_chemical_symbols()
        np.testing.assert_allclose(b.positions, a.positions, atol=ATOL)
        np.testing.assert_allclose(b.cell.array, a.cell.array, atol=ATOL)
        assert (b.pbc == a.pbc).all()
        assert b.info["REF_energy"] == pytest.approx(energy, rel=1e-12)
        np.testing.assert_allclose(b.arrays["REF_forces"], forces, atol=ATOL)
        np.testing.assert_allclose(b.info["REF_stress"], stress, rtol=1e-10)


ASE_KEYS = ReadOptions("energy", "forces", "stress")


def test_extxyz_round_trip(tmp_path):
    src = tmp_path / "in.extxyz"
    ase.io.write(src, sample_frames(), format="extxyz")
    manifest = convert("hea", [src], tmp_path / "out", opts=ASE_KEYS, progress=False)
    converted = ase.io.read(tmp_path / "out" / "frames_0000.extxyz", index=":")
    check_round_trip(sample_frames(), converted)
    assert {a.info["config_type"] for a in converted} == {"hea"}
    assert manifest["frames_per_shard"] == [3]
    gpa = ReadOptions("energy", "forces", "stress", "GPa")
    convert("hea", [src], tmp_path / "gpa", opts=gpa, progress=False)
    converted = ase.io.read(tmp_path / "gpa" / "frames_0000.extxyz", index=":")
    check_round_trip(sample_frames(), converted, factor=1 / 160.21766208)


def test_ase_db_round_trip(tmp_path):
    src = tmp_path / "in.db"
    with ase.db.connect(src) as db:
        for atoms in sample_frames():
            db.write(atoms)
    convert("cuni", [src], tmp_path / "out", opts=ASE_KEYS, progress=False)
    check_round_trip(sample_frames(),
                     ase.io.read(tmp_path / "out" / "frames_0000.extxyz", index=":"))
    # REF_* labels kept as key-value pairs and data; a frame without forces names its row id
    src2 = tmp_path / "ref.db"
    with ase.db.connect(src2) as db:
        atoms = Atoms("H2", positions=[[0, 0, 0], [0, 0, 0.74]])
        db.write(atoms, key_value_pairs={"REF_energy": -31.5},
                 data={"REF_forces": np.array([[0, 0, 0.5], [0, 0, -0.5]])})
        db.write(atoms, key_value_pairs={"REF_energy": -31.0})
    with pytest.raises(InvalidFrameError, match=rf"{src2}: frame id=2: missing forces"):
        convert("cuni", [src2], tmp_path / "out2", progress=False)
    convert("cuni", [src2], tmp_path / "out2", skip_invalid=True, progress=False)
    (got,) = ase.io.read(tmp_path / "out2" / "frames_0000.extxyz", index=":")
    assert got.info["REF_energy"] == -31.5
    np.testing.assert_allclose(got.arrays["REF_forces"], [[0, 0, 0.5], [0, 0, -0.5]])


def test_zip_of_extxyz_is_streamed(tmp_path):
    frames = sample_frames()
    ase.io.write(tmp_path / "a.extxyz", frames[:2], format="extxyz")
    ase.io.write(tmp_path / "b.extxyz", frames[2:], format="extxyz")
    src = tmp_path / "set.zip"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(tmp_path / "a.extxyz", "set/mp-1.extxyz")
        archive.write(tmp_path / "b.extxyz", "set/mp-2.extxyz")
        archive.writestr("set/README.txt", "not a frame file")
    manifest = convert("mptrj_extxyz", [src], tmp_path / "out", num_shards=3,
                       opts=ASE_KEYS, progress=False)
    assert manifest["frames_per_shard"] == [1, 1, 1]
    converted = [s[0] for s in read_shards(tmp_path / "out", 3)]
    check_round_trip(frames, converted)
    assert manifest["sources"][0]["sha256"] == file_digest(src)


def test_folder_input_and_cli(tmp_path, mptrj_file, capsys):
    folder = tmp_path / "raw"
    folder.mkdir()
    ase.io.write(folder / "x.extxyz", sample_frames(), format="extxyz")
    (folder / "notes.txt").write_text("ignored")
    out = tmp_path / "out"
    args = ["convert", "tmd", "--input", str(folder), "--output", str(out), "--shards", "2",
            "--energy-key", "energy", "--forces-key", "forces", "--stress-key", "stress",
            "--no-progress"]
    assert cli_main(args) == 0
    assert json.loads((out / "manifest.json").read_text())["frames_per_shard"] == [2, 1]
    args = ["convert", "mptrj", "--input", str(mptrj_file), "--output", str(tmp_path / "m"),
            "--no-progress"]
    assert cli_main(args) == 0 and "5 frames" in capsys.readouterr().out
    assert cli_main(["convert", "tmd", "--input", str(folder), "--output", str(out),
                     "--no-progress"]) == 1  # REF_energy is not in these files
    assert "frame 0: missing energy" in capsys.readouterr().err
    # the failed re-convert left the previous good output
    assert json.loads((out / "manifest.json").read_text())["frames_per_shard"] == [2, 1]


# ---------------------------------------------------------------- bad input


def good(seed: int) -> Atoms:
    atoms = Atoms("CuNi", positions=[[0, 0, 0], [1.8, 1.8, 0]], cell=[3.6, 3.6, 3.6], pbc=True)
    rng = np.random.default_rng(seed)
    atoms.info["REF_energy"] = float(rng.normal())
    atoms.info["REF_stress"] = np.eye(3) * 0.01
    atoms.arrays["REF_forces"] = rng.normal(size=(2, 3))
    return atoms


def _missing_energy(a):
    del a.info["REF_energy"]


def _missing_forces(a):
    del a.arrays["REF_forces"]


BAD = {
    "missing energy": _missing_energy,
    "missing forces": _missing_forces,
    "non-finite positions": lambda a: a.positions.__setitem__((1, 2), np.nan),
    "non-finite energy": (lambda a: a.info.__setitem__("REF_energy", np.inf)),
    "non-finite forces": (lambda a: a.arrays["REF_forces"].__setitem__((0, 1), np.nan)),
    "non-finite stress": (lambda a: a.info["REF_stress"].__setitem__((2, 2), -np.inf)),
    # 0.05 A apart only through the periodic boundary (4.95 A apart inside the cell)
    "overlapping atoms": (lambda a: a.set_positions([[0.02, 0, 0], [3.57, 0, 0]])),
    "singular cell with periodic boundaries": (
        lambda a: a.set_cell([[3.6, 0, 0], [0, 3.6, 0], [0, 0, 0]])),
    "unknown element": (lambda a: a.set_atomic_numbers([29, 0])),  # 'X'
    "empty frame": None,
}


def bad_frame(reason: str) -> Atoms:
    if reason == "empty frame":
        return Atoms()
    atoms = good(99)
    BAD[reason](atoms)
    return atoms


@pytest.mark.parametrize("reason", sorted(BAD))
def test_bad_frame_is_a_clear_error_or_skipped(tmp_path, reason):
    src = tmp_path / "bad.extxyz"
    frames = [good(0), good(1), bad_frame(reason), good(3), good(4)]
    ase.io.write(src, frames, format="extxyz")
    out = tmp_path / "out"
    with pytest.raises(InvalidFrameError) as err:
        convert("zeolite", [src], out, num_shards=2, progress=False)
    assert str(err.value).startswith(f"{src}: frame 2: {reason}")
    assert err.value.reason == reason and err.value.index == 2
    assert list(out.iterdir()) == []  # no shard, no manifest, no temporary file
    manifest = convert("zeolite", [src], out, num_shards=2, skip_invalid=True, progress=False)
    assert manifest["frames"] == 4 and manifest["skipped"] == 1
    assert manifest["skipped_by_reason"] == {reason: 1}
    assert manifest["skipped_examples"][0].startswith(f"{src}: frame 2: {reason}")
    assert sorted(p.name for p in out.iterdir()) == [
        "frames_0000.extxyz", "frames_0001.extxyz", "manifest.json"]


def test_failed_rerun_keeps_previous_outputs(tmp_path):
    src = tmp_path / "in.extxyz"
    ase.io.write(src, [good(0), good(1)], format="extxyz")
    out = tmp_path / "out"
    convert("zeolite", [src], out, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    ase.io.write(src, [good(0), bad_frame("missing forces")], format="extxyz")
    with pytest.raises(InvalidFrameError):
        convert("zeolite", [src], out, progress=False)
    # replaced only on success: old shards and manifest as they were, no leftovers
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_validate_atoms():
    assert frame_message(good(0), "f.extxyz", 7) is None
    message = frame_message(bad_frame("overlapping atoms"), "f.extxyz", 7)
    assert message.startswith("f.extxyz: frame 7: overlapping atoms (atoms 0 and 1 are 0.0500 A")
    far = bad_frame("overlapping atoms")
    far.pbc = False  # without periodic images the two atoms are 3.55 A apart
    assert frame_message(far, "f.extxyz", 7) is None
    slab = good(0)
    slab.pbc = [True, True, False]
    slab.set_positions([[0, 0, 0.0], [0, 0, 3.55]])  # images along z do not exist
    assert frame_message(slab, "f", 0) is None
    slab.set_positions([[0, 0, 0.0], [0, 3.55, 0]])  # along y they do
    assert "overlapping atoms" in frame_message(slab, "f", 0)
    tiny = good(0)[:1]
    tiny.set_cell([0.05, 3.0, 3.0])  # an atom 0.05 A from its own image
    assert "overlapping atoms" in frame_message(tiny, "f", 0)
    molecule = Atoms("H2", positions=[[0, 0, 0], [0, 0, 0.74]])  # zero cell, no pbc: fine
    molecule.info["REF_energy"] = -31.0
    molecule.arrays["REF_forces"] = np.zeros((2, 3))
    assert frame_message(molecule, "f", 0) is None
    for reason in BAD:
        assert frame_message(bad_frame(reason), "f", 3).startswith(f"f: frame 3: {reason}")
        with pytest.raises(InvalidFrameError) as err:
            validate_atoms(bad_frame(reason), "f", 3)
        assert (err.value.source, err.value.index, err.value.reason) == ("f", 3, reason)
    assert validate_atoms(good(0), "f", 3) is None
    renamed = good(0)
    renamed.info["E"] = renamed.info.pop("REF_energy")
    renamed.arrays["F"] = renamed.arrays.pop("REF_forces")
    keys = {"energy": "E", "forces": "F", "stress": None}
    assert validate_atoms(renamed, "f", 0, keys=keys) is None
    assert frame_message(renamed, "f", 0) == "f: frame 0: missing energy"


def test_batch_check_gives_each_frame_its_own_first_problem():
    """Checks vectorised over a batch give every frame the problem it has alone; a frame with
    several problems gets the first in the order of checks, whatever its neighbours have."""
    nan_cell = good(5)
    nan_cell.cell[0, 0] = np.nan
    several = bad_frame("non-finite forces")  # ... and an unknown element, checked earlier
    BAD["unknown element"](several)
    del several.info["REF_energy"]
    voigt = good(6)
    voigt.info["REF_stress"] = np.array([np.nan, 0, 0, 0, 0, 0])
    frames = [good(0), *(bad_frame(r) for r in sorted(BAD)), nan_cell, several, voigt, good(1)]
    alone = [atoms_problem(a, "f", k) for k, a in enumerate(frames)]
    assert [p and p[0] for p in alone] == [None, *sorted(BAD), "non-finite cell",
                                           "unknown element", "non-finite stress", None]
    assert atoms_problems(frames, "f") == alone
    assert atoms_problems(frames[::-1], "f") == alone[::-1]
    assert atoms_problems(frames, "f", check_overlap=False) == [
        None if p and p[0] == "overlapping atoms" else p for p in alone]
    assert alone[sorted(BAD).index("unknown element") + 1] == (
        "unknown element", "atomic number 0 at atom 1")
    assert alone[sorted(BAD).index("non-finite forces") + 1] == ("non-finite forces", "1 values")


def test_unknown_stress_unit_and_missing_input(tmp_path):
    with pytest.raises(ValueError, match="unknown stress unit 'psi'"):
        convert("hea", [tmp_path], tmp_path / "o", opts=ReadOptions(stress_unit="psi"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        convert("hea", [tmp_path / "nope.extxyz"], tmp_path / "o")


def test_overlap_check_matches_ase_neighbor_list():
    """Random triclinic cells, mixed pbc, close pairs across boundaries and self-images."""
    from ase.neighborlist import neighbor_list

    rng = np.random.default_rng(5)
    outcomes = set()
    for _ in range(40):
        # well-conditioned skew cells: ASE's reference search crawls on nearly flat ones
        cell = np.diag(rng.uniform(0.3, 3.0, 3)) @ (np.eye(3) + rng.uniform(-0.2, 0.2, (3, 3)))
        pbc = rng.random(3) < 0.6
        positions = rng.random((int(rng.integers(1, 5)), 3)) @ cell
        partner = positions[0] + rng.normal(size=3) * 0.06 + rng.integers(-2, 3, 3) @ cell
        atoms = Atoms(["Cu"] * (len(positions) + 1), positions=np.vstack([positions, partner]),
                      cell=cell, pbc=pbc)
        atoms.info["REF_energy"] = 0.0
        atoms.arrays["REF_forces"] = np.zeros((len(atoms), 3))
        expected = len(neighbor_list("i", atoms, 0.1, self_interaction=False)) > 0
        message = frame_message(atoms, "f", 0)
        assert (message is not None and "overlapping atoms" in message) == expected, message
        outcomes.add(expected)
    assert outcomes == {True, False}
