"""ASE trajectories, read by ASE: each frame with the calculator results it was saved
with."""

from __future__ import annotations

from collections.abc import Iterator

import ase.io

from cfmtrain.frames.extxyz import EmptyInputError
from cfmtrain.readers.options import Part, ReadOptions
from cfmtrain.readers.read import Read

TITLE = "ASE trajectories"
RANGES = False


def read(part: Part, options: ReadOptions | None = None) -> Iterator[Read]:
    """Every frame as atoms; a trajectory without frames is an error."""
    source, count = str(part.path), 0
    for index, atoms in enumerate(ase.io.iread(source, index=":", format="traj")):
        count += 1
        yield source, index, atoms
    if count == 0:
        raise EmptyInputError(source, "no frames read")
