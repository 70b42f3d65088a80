"""The input formats' one table (cfmtrain.frames.formats): every check of a suffix accepts
exactly its rows, each row serves registered and own data alike, a new format is one reader
module and one row, and no second list of suffixes is left in the code, workflow or schema."""

from __future__ import annotations

import ast
import copy
import gzip
import json
import re
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path

import ase.db
import ase.io
import numpy as np
import pytest
import yaml
from ase import Atoms
from ase.calculators.singlepoint import SinglePointCalculator
from ase.io.formats import ioformats
from helpers import REPO
from test_convert import ASE_KEYS, mptrj_fixture, sample_frames

from cfmtrain import docs
from cfmtrain.cli import main as cli_main
from cfmtrain.config_check import check_workflow_config
from cfmtrain.frames.formats import FORMATS
from cfmtrain.readers.options import ReadOptions
from cfmtrain.readers.own import parse_keys
from cfmtrain.shards.convert import convert, convert_own
from cfmtrain.shards.registered import expand_inputs
from cfmtrain.train.config import ConfigError

DEFAULT = yaml.safe_load((REPO / "config/config.yaml").read_text())
DEFAULT.setdefault("split", {}).setdefault("seed", 0)
# suffixes a second table would hold: every row, ASE's extensions and format names, near misses
CANDIDATES = sorted({*FORMATS, *(s.upper() for s in FORMATS),
                     *(f".{e}" for f in ioformats.values() for e in f.extensions),
                     *(f".{name}" for name in ioformats), ".gz", ".txt", ".json.bz2",
                     ".xyz.part", ".extxyz.corrupt", ".tar.gz"})


def known(suffix: str) -> bool:
    return suffix.lower() in FORMATS


def config_accepts(path: Path) -> bool:
    """The config check of `snakemake -n` on an own set of `path` (and on its E0s file)."""
    for cfg in ({"paths": [str(path)]}, {"paths": [str(path)], "e0s": {"file": str(path)}}):
        config = copy.deepcopy(DEFAULT)
        config["datasets"]["own"] = {"kind": "files", **cfg}
        try:
            check_workflow_config(config, library_checks=False)
        except ConfigError as err:
            assert "unknown suffix" in str(err), err
            return False
    return True


def convert_accepts(path: Path, out: Path) -> tuple[bool, bool]:
    """Whether `cfmtrain convert` reads `path` (an empty file: its reader refuses it as such)
    as a registered set's file and as own data."""
    accepted = []
    for run in (lambda: convert("x", [path], out, progress=False),
                lambda: convert_own("x", [path], out, progress=False)):
        with pytest.raises(ValueError) as err:
            run()
        accepted.append("unknown suffix" not in str(err.value))
    return accepted[0], accepted[1]


def download_finds(folder: Path, capsys) -> int:
    """The files `cfmtrain download` counts in a manual set's folder."""
    code = cli_main(["download", "cuni", "--dest", str(folder)])
    out = capsys.readouterr().out
    found = re.search(r"found (\d+) file", out)
    return int(found.group(1)) if code == 0 and found else 0


def test_every_check_accepts_exactly_the_tables_suffixes(tmp_path, capsys):
    folder = tmp_path / "files"
    folder.mkdir()
    for k, suffix in enumerate(CANDIDATES):
        path = folder / f"f{k}{suffix}"
        path.write_text("")
        assert config_accepts(path) == known(suffix), suffix
        assert convert_accepts(path, tmp_path / "out") == (known(suffix),) * 2, suffix
    expected = sorted(p for p in folder.iterdir() if known(p.name[p.name.index("."):]))
    assert expand_inputs([folder]) == expected  # a manual set's folder
    assert download_finds(folder, capsys) == len(expected)
    listed = [s for _, sfx in docs.formats() for s in sfx]
    assert sorted(listed) == sorted(FORMATS)  # docs/own-data.md and the schema's descriptions


def write_sample(path: Path) -> None:
    """Sample frames in the format of `path`'s suffix (tests/shards/test_convert.py's)."""
    name = path.name.lower()
    if name.endswith((".json", ".json.gz")):
        text = json.dumps(mptrj_fixture())
        path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    elif name.endswith(".zip"):
        ase.io.write(path.with_suffix(".extxyz"), sample_frames(), format="extxyz")
        with zipfile.ZipFile(path, "w") as archive:
            archive.write(path.with_suffix(".extxyz"), "set/a.extxyz")
    elif name.endswith(".db"):
        with ase.db.connect(path) as db:
            for atoms in sample_frames():
                db.write(atoms)
    else:
        ase.io.write(path, sample_frames(), format="traj" if name.endswith(".traj") else
                     "extxyz")


@pytest.mark.parametrize("suffix", list(FORMATS))
def test_every_format_converts_as_registered_and_own_data_alike(suffix, tmp_path):
    """A row serves every kind of data set: the same labels (an MPtrj record's by its
    registry entry's keys and unit, or as own data by ASE's conventions)."""
    path = tmp_path / f"in{suffix}"
    write_sample(path)
    name, opts = ("mptrj", None) if FORMATS[suffix] == "mptrj" else ("x", ASE_KEYS)
    convert(name, [path], tmp_path / "reg", opts=opts, progress=False)
    convert_own(name, [path], tmp_path / "own", progress=False)
    frames = [ase.io.read(tmp_path / kind / "frames_0000.extxyz", ":") for kind in ("reg", "own")]
    assert len(frames[0]) == len(frames[1]) >= 3
    for reg, own in zip(*frames, strict=True):
        assert reg.get_chemical_symbols() == own.get_chemical_symbols()
        assert own.info["REF_energy"] == reg.info["REF_energy"]
        np.testing.assert_array_equal(own.arrays["REF_forces"], reg.arrays["REF_forces"])
        np.testing.assert_allclose(own.info["REF_stress"], reg.info["REF_stress"], rtol=1e-12)
    if FORMATS[suffix] == "mptrj":  # own data's keys choose the other energy
        keys = parse_keys(["energy=corrected_total_energy"])
        convert_own(name, [path], tmp_path / "corrected", keys=keys, progress=False)
        corrected = ase.io.read(tmp_path / "corrected/frames_0000.extxyz", ":")
        assert [a.info["REF_energy"] for a in corrected] == [
            a.info["corrected_total_energy"] for a in frames[1]] != [
            a.info["REF_energy"] for a in frames[1]]


# ---------------------------------------------------------------- a new format


def read_demo(part, options: ReadOptions | None = None) -> Iterator[tuple[str, int, Atoms]]:
    """A format of one atom per line, `symbol x y z energy`, forces zero."""
    for index, line in enumerate(part.path.read_text().splitlines()):
        symbol, *xyz, energy = line.split()
        atoms = Atoms(symbol, positions=[[float(v) for v in xyz]])
        atoms.calc = SinglePointCalculator(atoms, energy=float(energy), forces=np.zeros((1, 3)))
        yield str(part.path), index, atoms


def test_a_new_format_is_one_module_and_one_row(tmp_path, monkeypatch, capsys):
    module = types.ModuleType("cfmtrain.readers.demo_lines")
    module.TITLE, module.RANGES, module.read = "demo lines", False, read_demo
    monkeypatch.setitem(sys.modules, module.__name__, module)  # the one file
    folder = tmp_path / "set"
    folder.mkdir()
    path = folder / "a.demo"
    path.write_text("Cu 0 0 0 -3.5\nNi 0 0 0 -4.4\n")
    assert not config_accepts(path)
    monkeypatch.setitem(FORMATS, ".demo", "demo_lines")  # the one row
    assert config_accepts(path)
    ase_keys = ReadOptions("energy", "forces", None)
    assert convert("x", [folder], tmp_path / "reg", opts=ase_keys, progress=False)["frames"] == 2
    own = convert_own("x", [path], tmp_path / "own", progress=False)
    assert own["frames"] == 2
    assert download_finds(folder, capsys) == 1
    assert ("demo lines", (".demo",)) in docs.formats()
    assert "`.demo` | demo lines" in docs.formats_table()
    assert ".demo" in cli_main_help(capsys)


def cli_main_help(capsys) -> str:
    with pytest.raises(SystemExit):
        cli_main(["convert", "--help"])
    return capsys.readouterr().out


# ---------------------------------------------------------------- no second table


def suffix_tokens(text: str) -> set[str]:
    """The table's suffixes that `text` names as words (`.db`, not `e0s.json`'s `.json`)."""
    return {s for s in FORMATS if re.search(rf"(?<![\w.-]){re.escape(s)}(?![\w.])", text)}


def second_lists(source: str) -> list[str]:
    """Python constants that list two or more of the table's suffixes: a collection of them,
    or a text naming them."""
    found = []
    for node in ast.walk(ast.parse(source)):
        items = (node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set))
                 else node.keys if isinstance(node, ast.Dict) else [])
        values = {i.value for i in items if isinstance(i, ast.Constant)}
        if len(values & set(FORMATS)) >= 2:
            found.append(ast.unparse(node)[:80])
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and len(suffix_tokens(node.value)) >= 2:
            found.append(node.value[:80])
    return found


def descriptions(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("description"), str):
            yield node["description"]
        for value in node.values():
            yield from descriptions(value)
    elif isinstance(node, list):
        for value in node:
            yield from descriptions(value)


def test_no_second_list_of_suffixes(tmp_path):
    table = REPO / "src/cfmtrain/frames/formats.py"
    python = [p for p in (REPO / "src/cfmtrain").rglob("*.py") if p != table]
    found = {str(p.relative_to(REPO)): hits for p in python
             if (hits := second_lists(p.read_text()))}
    rules = [REPO / "Snakefile", *(REPO / "workflow").rglob("*.smk")]
    found |= {str(p.relative_to(REPO)): [line.strip() for line in p.read_text().splitlines()
                                         if len(suffix_tokens(line)) >= 2] for p in rules}
    schema = yaml.safe_load((REPO / docs.SCHEMA).read_text())
    found["schema"] = [d[:80] for d in descriptions(schema) if len(suffix_tokens(d)) >= 2]
    assert {k: v for k, v in found.items() if v} == {}
    assert docs.FORMATS_FIELD in str(schema["properties"]["datasets"])
    # the scan sees a second table when one is written back
    assert second_lists('SUFFIXES = (".extxyz", ".xyz", ".db")')
    assert second_lists('FORMATS = {".traj": "traj", ".db": "db"}')
    assert second_lists('help = "own files (.extxyz/.xyz/.db/.traj)"')
    assert not second_lists('name = "e0s.json"; report = path.with_suffix(".json")')
