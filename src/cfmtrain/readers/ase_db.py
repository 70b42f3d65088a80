"""ASE databases (.db): the one reader of their rows, for registered and own data sets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ase.db
from ase import Atoms


def db_rows(path: Path) -> Iterator[tuple[str, Atoms, dict]]:
    """("id=N", atoms, the row's data) of every row: atoms carry the row's key-value pairs in
    `info` and its calculator results (energy, forces, stress) as ASE stores them."""
    with ase.db.connect(str(path)) as db:
        for row in db.select():
            atoms = row.toatoms()
            atoms.info.update(row.key_value_pairs)
            yield f"id={row.id}", atoms, dict(row.get("data") or {})
