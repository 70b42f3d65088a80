"""Registered data sets' files by format: extxyz, a zip of extxyz, ASE databases and MPtrj
JSON, streamed as RawFrames (cfmtrain.frames.validate) with errors naming file and frame."""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cfmtrain.frames.extxyz import EmptyInputError, iter_extxyz, iter_extxyz_file, named_errors
from cfmtrain.frames.validate import RawFrame, raw_from_atoms
from cfmtrain.readers.ase_db import db_rows
from cfmtrain.readers.mptrj import read_mptrj
from cfmtrain.readers.options import Part, ReadOptions, problem_frame

EXTXYZ_SUFFIXES = (".extxyz", ".xyz")


def _raw(atoms, problem, source: str, index: int, opts: ReadOptions) -> RawFrame:
    if problem is not None:
        return problem_frame(source, index, problem)
    return raw_from_atoms(atoms, source, index, opts.energy_key, opts.forces_key,
                          opts.stress_key, opts.stress_factor)


def read_extxyz(part: Part, opts: ReadOptions) -> Iterator[RawFrame]:
    """Stream the frames of one extxyz file or part of one (cfmtrain.frames.extxyz: a bad frame
    names the file, frame and line; an empty file is an error)."""
    reads = iter_extxyz_file(part.path, part.first, part.offset, part.line, part.count)
    for index, atoms, problem in reads:
        yield _raw(atoms, problem, str(part.path), index, opts)


def read_extxyz_zip(path: Path, opts: ReadOptions) -> Iterator[RawFrame]:
    """Stream the frames of every extxyz member of a zip archive (nothing extracted to disk)."""
    with zipfile.ZipFile(path) as archive:
        members = sorted(n for n in archive.namelist() if n.endswith(EXTXYZ_SUFFIXES))
        if not members:
            raise EmptyInputError(str(path), f"no {'/'.join(EXTXYZ_SUFFIXES)} member")
        for member in members:
            with archive.open(member) as raw:
                source = f"{path}:{member}"
                for index, atoms, problem in iter_extxyz(io.TextIOWrapper(raw, "utf-8"), source):
                    yield _raw(atoms, problem, source, index, opts)


def read_ase_db(path: Path, opts: ReadOptions) -> Iterator[RawFrame]:
    """Stream the rows of an ASE database; key-value pairs and data are searched for labels."""
    rows = 0
    for index, atoms, data in db_rows(path):
        rows += 1
        for key, value in data.items():
            if key == opts.forces_key and np.shape(value) == (len(atoms), 3):
                atoms.arrays[key] = np.asarray(value, dtype=float)
            else:
                atoms.info[key] = value
        yield raw_from_atoms(atoms, str(path), index, opts.energy_key, opts.forces_key,
                             opts.stress_key, opts.stress_factor)
    if rows == 0:
        raise EmptyInputError(str(path), "a database without rows")


def reader_for(path: Path) -> str:
    """The reader a file needs, from its name: mptrj, zip, db or extxyz."""
    name = path.name.lower()
    if name.endswith((".json", ".json.gz")):
        return "mptrj"
    if name.endswith(".zip"):
        return "zip"
    if name.endswith(".db"):
        return "db"
    if name.endswith(EXTXYZ_SUFFIXES):
        return "extxyz"
    raise ValueError(f"{path}: unknown input format (expected .extxyz, .xyz, .zip, .db, "
                     f".json or .json.gz)")


def expand_inputs(inputs: Sequence[str | os.PathLike]) -> list[Path]:
    """Files as given, folders replaced by their supported files (sorted); errors if none."""
    files: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            found = sorted(p for p in item.rglob("*") if p.is_file() and _supported(p))
            if not found:
                raise FileNotFoundError(f"{item}: no .extxyz/.xyz/.zip/.db/.json files found")
            files.extend(found)
        elif item.is_file():
            files.append(item)
        else:
            raise FileNotFoundError(f"{item}: no such file or folder")
    return files


def _supported(path: Path) -> bool:
    try:
        reader_for(path)
    except ValueError:
        return False
    return not path.name.endswith((".part", ".corrupt"))


@dataclass(frozen=True)
class RegistryReader:
    """Reads the parts of a registered data set's files (shards.parts.PartReader)."""

    opts: ReadOptions

    def frames(self, part: Part) -> Iterator[RawFrame]:
        """The part's frames in order, each with its source file and index."""
        path = part.path
        if path.stat().st_size == 0:
            raise EmptyInputError(str(path))
        kind = reader_for(path)
        frames = (read_extxyz(part, self.opts) if kind == "extxyz"
                  else {"zip": read_extxyz_zip, "db": read_ase_db,
                        "mptrj": read_mptrj}[kind](path, self.opts))
        yield from named_errors(frames, str(path), lambda frame: frame.index)

    def summary(self) -> dict:
        return {}
