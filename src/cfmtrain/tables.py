"""Results tables declared once: a record (a dataclass beside the table's writer) whose fields
are the table's columns in order, with one writer and one reader for every such table.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from cfmtrain.atomic import atomic_path

if TYPE_CHECKING:
    import pandas as pd

R = TypeVar("R", bound="Record")


class Columns:
    """A record's column names as attributes (`StepRecord.col.rank == "rank"`), for the places
    that need a name as a string (a subscript, a groupby); a misspelt one is an AttributeError."""

    def __init__(self, record: type[Record]):
        self._record, self._names = record, record.columns()

    def __getattr__(self, name: str) -> str:
        if name in self._names:
            return name
        raise AttributeError(f"{self._record.__name__} has no column {name!r}")


class _ColumnsOf:
    """`Record.col`: the class's Columns."""

    def __get__(self, obj: object, owner: type[Record]) -> Columns:
        return _columns(owner)


@functools.cache
def _columns(record: type[Record]) -> Columns:
    return Columns(record)


class Record:
    """Base of a table's record: a dataclass whose fields are the table's columns, in order.

    TABLE names the table in errors, WRITER says what writes it; OPTIONAL lists the columns a
    file written by an older version lacks (a reader may not find them there)."""

    TABLE: ClassVar[str] = "table"
    WRITER: ClassVar[str] = "cfmtrain"
    OPTIONAL: ClassVar[tuple[str, ...]] = ()
    col: ClassVar[_ColumnsOf] = _ColumnsOf()

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """The table's columns, in order."""
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def missing(cls, present: Iterable[str]) -> list[str]:
        """The columns, OPTIONAL ones aside, that are not among `present`."""
        have = set(present)
        return [c for c in cls.columns() if c not in have and c not in cls.OPTIONAL]

    @classmethod
    def of(cls, row: Mapping[str, Any], missing: Any = math.nan) -> Self:
        """The record of a row (a dict with these columns and maybe more); a column the row
        lacks takes `missing` (NaN: empty in the CSV)."""
        return cls(**{name: row.get(name, missing) for name in cls.columns()})

    def row(self) -> dict[str, Any]:
        """The record as a row (column: value)."""
        return {name: getattr(self, name) for name in self.columns()}


def frame(rows: Sequence[Record], record: type[Record]) -> pd.DataFrame:
    """`rows` as a table with `record`'s columns (none: the header alone)."""
    import pandas as pd  # lazy: the training loop imports records, and needs no pandas

    return pd.DataFrame([r.row() for r in rows], columns=list(record.columns()))


def records(table: pd.DataFrame, record: type[R]) -> list[R]:
    """The rows of `table` as records of `record` (a column more or less is a TypeError)."""
    return [record(**row) for row in table.to_dict("records")]


def write_table(path: str | os.PathLike, rows: Sequence[Record], record: type[Record]
                ) -> pd.DataFrame:
    """Write `rows` (records of `record`) as a CSV with its columns, atomically; the table."""
    table = frame(rows, record)
    with atomic_path(path) as tmp:
        table.to_csv(tmp, index=False)
    return table


def read_table(path: str | os.PathLike, record: type[Record], empty_ok: bool = False
               ) -> pd.DataFrame:
    """A CSV holding `record`'s columns (all but its OPTIONAL ones) and, unless `empty_ok`, at
    least one row; one that does not is an error naming the file and what it lacks."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: missing (written by {record.WRITER})")
    import pandas as pd  # lazy: as in frame()

    table = pd.read_csv(path)
    missing = record.missing(table.columns)
    if missing:
        raise ValueError(f"{path}: not a {record.TABLE}, missing columns {missing} (written by "
                         f"{record.WRITER}; has {list(table.columns)})")
    if table.empty and not empty_ok:
        raise ValueError(f"{path}: no rows")
    return table
