"""extxyz and xyz files, read line by line (cfmtrain.frames.extxyz): a bad frame is named by
file, frame and line, and a part may be a range of a large file's frames."""

from __future__ import annotations

from collections.abc import Iterator

from cfmtrain.frames.extxyz import iter_extxyz_file
from cfmtrain.readers.options import Part, ReadOptions, problem_frame
from cfmtrain.readers.read import Read

TITLE = "extxyz"
RANGES = True


def read(part: Part, options: ReadOptions | None = None) -> Iterator[Read]:
    """The part's frames as atoms (labels under the file's own names), or unreadable ones."""
    source = str(part.path)
    for index, atoms, problem in iter_extxyz_file(part.path, part.first, part.offset, part.line,
                                                  part.count):
        yield problem_frame(source, index, problem) if problem else (source, index, atoms)
