"""ASE databases: the one reader of their rows, for every kind of data set; each row's
key-value pairs and data are the frame's info, where the labels are looked for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ase.db
from ase import Atoms

from cfmtrain.frames.extxyz import EmptyInputError
from cfmtrain.readers.options import Part, ReadOptions
from cfmtrain.readers.read import Read

TITLE = "ASE databases"
RANGES = False


def db_rows(path: Path) -> Iterator[tuple[str, Atoms, dict]]:
    """("id=N", atoms, the row's data) of every row: atoms carry the row's key-value pairs in
    `info` and its calculator results (energy, forces, stress) as ASE stores them."""
    with ase.db.connect(str(path)) as db:
        for row in db.select():
            atoms = row.toatoms()
            atoms.info.update(row.key_value_pairs)
            yield f"id={row.id}", atoms, dict(row.get("data") or {})


def read(part: Part, options: ReadOptions | None = None) -> Iterator[Read]:
    """Every row as atoms whose info holds its key-value pairs, then its data."""
    source, rows = str(part.path), 0
    for index, atoms, data in db_rows(part.path):
        rows += 1
        atoms.info.update(data)
        yield source, index, atoms
    if rows == 0:
        raise EmptyInputError(source, "a database without rows")
