"""Zip archives of extxyz files: every extxyz member, in name order, read from the archive
(nothing extracted to disk); a frame is named `archive:member`."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator

from cfmtrain.frames.extxyz import EmptyInputError, iter_extxyz
from cfmtrain.frames.formats import suffixes
from cfmtrain.readers.options import Part, ReadOptions, problem_frame
from cfmtrain.readers.read import Read

TITLE = "zip archives of extxyz files"
RANGES = False


def read(part: Part, options: ReadOptions | None = None) -> Iterator[Read]:
    """The frames of every member whose suffix is extxyz's, as atoms or unreadable ones."""
    members_of = suffixes("extxyz")
    with zipfile.ZipFile(part.path) as archive:
        members = sorted(n for n in archive.namelist() if n.endswith(members_of))
        if not members:
            raise EmptyInputError(str(part.path), f"no {'/'.join(members_of)} member")
        for member in members:
            with archive.open(member) as raw:
                source = f"{part.path}:{member}"
                for index, atoms, problem in iter_extxyz(io.TextIOWrapper(raw, "utf-8"), source):
                    yield problem_frame(source, index, problem) if problem else (source, index,
                                                                                  atoms)
