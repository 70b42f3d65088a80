"""Extxyz frames with MACE's keys (REF_energy, REF_forces, REF_stress, config_type).

Labelling a structure, writing frames round-robin into extxyz files through `atomic_path` (the
one extxyz writer), and reading extxyz with errors that name the file, the frame and the line
(`iter_extxyz`).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import ase.io
import numpy as np
from ase import Atoms
from ase.data import atomic_numbers
from ase.io.extxyz import key_val_str_to_dict, parse_properties

from cfmtrain.atomic import atomic_path
from cfmtrain.diskfull import writing
from cfmtrain.frames.labels import CONFIG_TYPE_KEY, ENERGY_KEY, FORCES_KEY, STRESS_KEY
from cfmtrain.frames.validate import InvalidFrameError, Problem


def mace_frame(
    atoms: Atoms,
    energy: float,
    forces: np.ndarray,
    stress: np.ndarray | None = None,
    config_type: str | None = None,
) -> Atoms:
    """A calculator-free copy of `atoms` carrying labels under MACE's keys.

    `stress` is a 3x3 matrix in eV/Å^3 with ASE's sign, or None to omit it.
    """
    forces = np.asarray(forces, dtype=float)
    if forces.shape != (len(atoms), 3):
        raise ValueError(f"forces have shape {forces.shape}, expected ({len(atoms)}, 3)")
    if not np.isfinite(energy) or not np.isfinite(forces).all():
        raise ValueError(f"non-finite energy or forces for {atoms.get_chemical_formula()}")
    frame = Atoms(atoms.numbers, positions=atoms.positions, cell=atoms.cell, pbc=atoms.pbc)
    frame.info[ENERGY_KEY] = float(energy)
    if stress is not None:
        stress = np.asarray(stress, dtype=float)
        if stress.shape != (3, 3) or not np.isfinite(stress).all():
            raise ValueError(f"stress must be a finite 3x3 matrix, got {stress!r}")
        frame.info[STRESS_KEY] = stress
    if config_type is not None:
        frame.info[CONFIG_TYPE_KEY] = config_type
    frame.arrays[FORCES_KEY] = forces
    return frame


def write_shards(frames: Iterable[Atoms], paths: list[Path]) -> list[int]:
    """Write labelled `frames` (unchecked: a generator's own) round-robin into the extxyz files
    `paths`, each atomically.

    Returns the frames written per shard. Nothing appears under the final names unless every
    frame was written (an error raised by `frames` renames nothing).
    """
    counts = [0] * len(paths)
    with contextlib.ExitStack() as stack:
        if hasattr(frames, "close"):  # a generator stopped by an error ends now (its pool too)
            stack.callback(frames.close)
        tmps = [stack.enter_context(atomic_path(p)) for p in paths]
        handles = [stack.enter_context(open(t, "w")) for t in tmps]
        for i, frame in enumerate(frames):
            k = i % len(paths)
            with writing(paths[k]):  # a full disk names the shard it stopped
                ase.io.write(handles[k], frame, format="extxyz")
            counts[k] += 1
    # the stack closed each handle before its atomic_path renamed it (last in, first out)
    return counts



# ---------------------------------------------------------------- reading

# Frames whose extent is known (the atom count matched) but whose content is bad come back as a
# problem, so --skip-invalid can skip them; a file whose frame boundaries are lost (an atom count
# that does not match the atom lines, a blank line between frames) raises InvalidFrameError.
Read = tuple[int, Atoms | None, Problem | None]  # (frame index, atoms or None, problem or None)
COUNT_MISMATCH = "atom count does not match the atom lines"
T = TypeVar("T")
_HINTS = {"D": " (deuterium: write H)", "T": " (tritium: write H)"}


class EmptyInputError(ValueError):
    """An input file without a single frame."""

    def __init__(self, source: str, detail: str = "empty file") -> None:
        self.source, self.detail = source, detail
        super().__init__(f"{source}: no frames ({detail})")

    def __reduce__(self):  # raised in a conversion's worker process, re-raised in its parent
        return type(self), (self.source, self.detail)


def _n_atoms(n: int) -> str:
    return f"{n} atom" + ("" if n == 1 else "s")


def _short(line: str, width: int = 60) -> str:
    line = line.rstrip("\r\n")
    return repr(line if len(line) <= width else line[:width] + "...")


def named_errors(items: Iterable[T], source: str, index_of: Callable[[T], int | str],
                 ) -> Iterator[T]:
    """`items` (frames) of a reader, whose errors that name neither file nor frame (ASE's,
    zipfile's, sqlite's ...) are re-raised as InvalidFrameError naming `source` and the frame
    after the last one read (its index + 1, or `after ID` for ids such as a database's)."""
    items = iter(items)
    last: int | str | None = None
    while True:
        try:
            item = next(items)
        except StopIteration:
            return
        except (InvalidFrameError, EmptyInputError):
            raise
        except Exception as err:  # any library's error: say where it happened
            where = 0 if last is None else last + 1 if isinstance(last, int) else f"after {last}"
            raise InvalidFrameError(source, where, "unreadable frame",
                                    f"{type(err).__name__}: {err}") from err
        last = index_of(item)
        yield item


def _atom_count(line: str) -> int | None:
    try:
        return int(line)
    except ValueError:
        return None


def _columns(comment: str) -> tuple[int, str, int | None]:
    """(columns per atom line, Properties string, index of the species column or None)."""
    info = key_val_str_to_dict(comment) if comment.strip() else {}
    props = info.get("Properties", "species:S:1:pos:R:3")
    properties, names, _, convs = parse_properties(props)
    species = None
    if "species" in properties:
        column = 0
        for name in names:
            if name == "species":
                species = column
                break
            column += properties[name][1]
    return len(convs), props, species


def _content_problem(lines: list[str], first_line: int, natoms: int, at_eof: bool,
                     ) -> Problem | None:
    """A bad comment line or atom line (column count), before ASE sees them; COUNT_MISMATCH
    for a lone integer among the atom lines (the caller raises it)."""
    try:
        ncols, props, _ = _columns(lines[1])
    except (ValueError, KeyError, IndexError, TypeError) as err:
        return ("bad comment line", f"line {first_line + 1}: {err}")
    for atom, line in enumerate(lines[2:2 + natoms]):
        fields = line.split()
        if len(fields) != ncols:
            where = f"atom {atom} (line {first_line + 2 + atom})"
            if len(fields) == 1 and _atom_count(line) is not None:  # the next frame's header
                return (COUNT_MISMATCH, f"line {first_line} declares {_n_atoms(natoms)}, but "
                        f"line {first_line + 2 + atom} among them is {_short(line)}, like the "
                        "next frame's atom count")
            if at_eof and atom == natoms - 1 and not line.endswith("\n"):
                return ("truncated frame", f"the file ends inside {where}: {_short(line)}")
            return ("wrong number of columns", f"{where} has {len(fields)} columns, Properties="
                    f"{props} declares {ncols}: {_short(line)}")
    return None


def _symbol_problem(lines: list[str], first_line: int) -> Problem | None:
    """The first element symbol ASE cannot read (checked once ASE has failed: it is slow)."""
    _, _, species = _columns(lines[1])
    if species is None:
        return None
    for atom, line in enumerate(lines[2:]):
        symbol = line.split()[species]
        if symbol.capitalize() not in atomic_numbers:  # as ASE reads it
            return ("unknown element symbol", f"{symbol!r} at atom {atom} (line "
                    f"{first_line + 2 + atom}){_HINTS.get(symbol, '')}")
    return None


def iter_extxyz(lines: Iterable[str], source: str, start: int = 0,
                 start_line: int = 0) -> Iterator[Read]:
    """Each frame of extxyz text as (index, atoms, None), or (index, None, problem) for a frame
    whose atom lines are all there but unreadable: truncated at the end of the file, a wrong
    number of columns, an unknown element symbol, a bad comment line or value. Text that starts
    inside a file (at a frame of `frame_offsets`) gives its frame's index as `start` and the
    lines before it as `start_line`, so that problems name the file's frame and line.

    Raises InvalidFrameError (file, frame, line) where the frame boundaries are lost, and
    EmptyInputError for text without a frame. ASE's reader would stop silently at a blank line,
    ignore extra columns and name neither file nor frame.
    """
    lines = iter(lines)
    line_no = start_line  # 1-based number of the last line read
    index = start
    previous: tuple[int, int] | None = None  # (atom count, header line) of the last frame
    for header in lines:
        line_no += 1
        if not header.strip():
            for extra in lines:
                line_no += 1
                if extra.strip():
                    raise InvalidFrameError(source, index, "blank line between frames",
                                            f"line {line_no - 1} is blank, line {line_no} is "
                                            f"{_short(extra)}; extxyz frames follow each other "
                                            "without blank lines (ASE stops reading there)")
            break
        natoms = _atom_count(header)
        if natoms is None or natoms < 0:
            if previous is not None:
                raise InvalidFrameError(source, index - 1, COUNT_MISMATCH,
                                        f"line {previous[1]} declares {_n_atoms(previous[0])}, but "
                                        f"line {line_no} after them is {_short(header)}, not the "
                                        "next frame's atom count")
            raise InvalidFrameError(source, index, "bad atom-count line",
                                    f"line {line_no} is {_short(header)}, expected the number "
                                    "of atoms")
        first = line_no
        chunk = [header]
        for line in lines:
            line_no += 1
            chunk.append(line)
            if len(chunk) == natoms + 2:
                break
        if len(chunk) < natoms + 2:
            found = max(len(chunk) - 2, 0)
            yield index, None, ("truncated frame", f"the file ends at line {line_no}: line "
                                f"{first} declares {_n_atoms(natoms)}, {found} atom line(s) follow")
            return
        at_eof = not chunk[-1].endswith("\n")
        problem = _content_problem(chunk, first, natoms, at_eof)
        if problem is not None and problem[0] == COUNT_MISMATCH:
            raise InvalidFrameError(source, index, *problem)
        atoms = None
        if problem is None:
            try:
                atoms = ase.io.read(io.StringIO("".join(chunk)), index=0, format="extxyz")
            except Exception as err:  # ASE raises many kinds; each becomes the frame's problem
                problem = _symbol_problem(chunk, first) or (
                    "unreadable frame", f"lines {first}-{line_no}: {type(err).__name__}: {err}")
        yield index, atoms, problem
        previous = (natoms, first)
        index += 1
    if index == start:
        raise EmptyInputError(source, "empty file" if line_no == start_line else "only blank lines")


def frame_offsets(path: str | os.PathLike, every: int) -> list[tuple[int, int, int]]:
    """(frame index, byte offset, lines before it) of every `every`-th frame of an extxyz
    file, from a scan of its atom-count lines alone (no frame is parsed). The scan stops at the
    first line where a count should be but is not: the frames after the last offset then read
    as one, and their reader names the problem."""
    offsets = []
    index = line = offset = 0
    with open(path, "rb") as fh:
        while header := fh.readline():
            natoms = _atom_count(header.decode("utf-8", "replace"))
            if natoms is None or natoms < 0:
                break
            if index % every == 0:
                offsets.append((index, offset, line))
            for _ in range(natoms + 1):
                if not fh.readline():
                    return offsets
            index, line = index + 1, line + natoms + 2
            offset = fh.tell()
    return offsets


def iter_extxyz_file(path: str | os.PathLike, first: int = 0, offset: int = 0, line: int = 0,
                     count: int | None = None) -> Iterator[Read]:
    """`iter_extxyz` of a file: all its frames, or `count` frames from frame `first` (at byte
    `offset`, after `line` lines: one of `frame_offsets`)."""
    with open(path, "rb") as raw:
        raw.seek(offset)
        frames = iter_extxyz(io.TextIOWrapper(raw, encoding="utf-8"), str(path), first, line)
        yield from frames if count is None else itertools.islice(frames, count)


def read_extxyz_atoms(path: str | os.PathLike) -> Iterator[Atoms]:
    """The frames of an extxyz file; any unreadable frame or an empty file is an error naming
    the file and frame (the strict form of `iter_extxyz`, e.g. for `cfmtrain graphs`)."""
    with open(path, encoding="utf-8") as fh:
        for index, atoms, problem in iter_extxyz(fh, str(path)):
            if problem is not None:
                raise InvalidFrameError(str(path), index, *problem)
            yield atoms
