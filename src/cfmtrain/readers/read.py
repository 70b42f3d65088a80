"""One part of an input file read by the reader its suffix names (cfmtrain.frames.formats), for
every kind of data set; errors name the file and the frame.

A reader module holds TITLE (what its files are, for the docs), RANGES (True if a part may be a
range of a file's frames: extxyz, which shards.parts cuts by a scan of its lines) and
`read(part, options)`, which yields each frame as (file, frame, atoms), its labels where the
file keeps them, or as a RawFrame: one it could not read (its problem), or, given `options`,
one it labelled by those key names itself (MPtrj, whose records are no atoms).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from cfmtrain.frames.extxyz import EmptyInputError, named_errors
from cfmtrain.frames.formats import FORMATS, format_of, suffixes
from cfmtrain.frames.validate import RawFrame
from cfmtrain.readers.e0s import Located
from cfmtrain.readers.options import Part, ReadOptions

Read = Located | RawFrame  # atoms to label, or a frame labelled or refused by its reader


def reader_of(path: str | os.PathLike) -> ModuleType:
    """The reader module of a file, by its suffix (ValueError for an unknown one)."""
    return importlib.import_module(f"cfmtrain.readers.{format_of(path)}")


def formats() -> list[tuple[str, tuple[str, ...]]]:
    """(title, suffixes) of every reader, in the table's order: what the docs list."""
    modules = dict.fromkeys(FORMATS.values())
    return [(importlib.import_module(f"cfmtrain.readers.{m}").TITLE, suffixes(m))
            for m in modules]


def ranges(path: Path) -> bool:
    """True if a part of the file may be a range of its frames."""
    return reader_of(path).RANGES


def read_part(part: Part, options: ReadOptions | None = None) -> Iterator[Read]:
    """The part's frames in order; an empty file is an error, and so is any library's error,
    named by file and frame."""
    reader, source = reader_of(part.path), str(part.path)
    if part.path.stat().st_size == 0:
        raise EmptyInputError(source)
    yield from named_errors(reader.read(part, options), source, _index)


def _index(item: Read) -> int | str:
    return item.index if isinstance(item, RawFrame) else item[1]
