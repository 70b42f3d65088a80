"""One's own data (config `kind: files`): extxyz/xyz, ASE databases (.db) and ASE trajectories
(.traj), by suffix, read as frames for `cfmtrain convert NAME --own-data` (cfmtrain.shards.own).

Labels are found as cfmtrain.frames.keys describes; each frame keeps its own config_type
(frames without one get the data set's name), so the graph store's subsets are config_types.
Isolated-atom frames (config_type IsolatedAtom / isolated_atom) are never trained on; they give
the E0s when config `e0s` is `isolated` (cfmtrain.readers.e0s).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import ase.io
from ase import Atoms

from cfmtrain.frames.extxyz import EmptyInputError, iter_extxyz_file, named_errors
from cfmtrain.frames.keys import FIELDS, LabelKeys, config_type_of, own_frame
from cfmtrain.frames.validate import InvalidFrameError, Problem, RawFrame
from cfmtrain.readers.ase_db import db_rows
from cfmtrain.readers.e0s import Located
from cfmtrain.readers.options import Part, problem_frame

FORMATS = {".extxyz": "extxyz", ".xyz": "extxyz", ".traj": "traj", ".db": "db"}
ISOLATED_TYPES = ("IsolatedAtom", "isolated_atom")


def own_format(path: Path) -> str:
    """The reader of a file, from its suffix: extxyz, traj or db."""
    try:
        return FORMATS[path.suffix.lower()]
    except KeyError:
        raise ValueError(f"{path}: unknown suffix {path.suffix!r} (own data: "
                         f"{', '.join(FORMATS)})") from None


def _db_atoms(path: Path) -> Iterator[tuple[str, Atoms]]:
    for index, atoms, data in db_rows(path):
        atoms.info.update(data)
        yield index, atoms


def read_located(part: Part) -> Iterator[tuple[str, int | str, Atoms | None, Problem | None]]:
    """(file, frame, atoms, None) of every frame of one file (or part of an extxyz file), or
    (file, frame, None, problem) for an unreadable one; errors name the file and frame; a file
    without frames is an error."""
    path = part.path
    kind, source = own_format(path), str(path)
    if path.stat().st_size == 0:
        raise EmptyInputError(source)
    if kind == "extxyz":
        for index, atoms, problem in iter_extxyz_file(path, part.first, part.offset, part.line,
                                                      part.count):
            yield source, index, atoms, problem
        return
    frames = (_db_atoms(path) if kind == "db"
              else enumerate(ase.io.iread(source, index=":", format=kind)))
    count = 0
    for index, atoms in named_errors(frames, source, lambda item: item[0]):
        count += 1
        yield source, index, atoms, None
    if count == 0:
        raise EmptyInputError(source, "no frames read")


def read_atoms(path: Path) -> Iterator[Located]:
    """(file, frame, atoms) of every frame of one file; an unreadable frame is an error."""
    for source, index, atoms, problem in read_located(Part(path)):
        if problem is not None:
            raise InvalidFrameError(source, index, *problem)
        yield source, index, atoms


@dataclass
class OwnReader:
    """Reads frames for training (shards.parts.PartReader); sets the isolated-atom frames
    aside and notes the elements (its summary)."""

    keys: LabelKeys
    isolated: list[Located] = field(default_factory=list)
    numbers: set[int] = field(default_factory=set)

    def frames(self, part: Part) -> Iterator[RawFrame]:
        """The part's frames to train on, in order."""
        for source, index, atoms, problem in read_located(part):
            if problem is not None:
                yield problem_frame(source, index, problem)
                continue
            if config_type_of(atoms, self.keys) in ISOLATED_TYPES:
                self.isolated.append((source, index, atoms))
                continue
            self.numbers.update(int(z) for z in atoms.numbers)
            yield own_frame(atoms, source, index, self.keys)

    def summary(self) -> dict:
        """The isolated-atom frames and elements seen since the last summary."""
        out = {"isolated": self.isolated, "numbers": self.numbers}
        self.isolated, self.numbers = [], set()
        return out


def parse_keys(pairs: Sequence[str]) -> LabelKeys:
    """`FIELD=NAME` pairs (`FIELD=` ignores the field) over the defaults."""
    keys: dict[str, str | None] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--key {pair!r}: expected FIELD=NAME with FIELD one of "
                             f"{', '.join(FIELDS)}")
        keys[name] = value or None
    return LabelKeys.from_mapping(keys)
