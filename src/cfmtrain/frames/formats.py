"""The input formats: the one table from a file's suffix to the reader (a module of
cfmtrain.readers) of its frames, for every kind of data set, and the lookups every check uses.

A new format is one reader module (its contract: cfmtrain.readers.read) and one row here: the
conversion, `snakemake -n`'s config check, a manual set's download check and the documentation
(`cfmtrain docs`) take the suffixes from this table alone. It sits below readers and sources so
that both may read it.
"""

from __future__ import annotations

import os
from pathlib import Path

# suffix -> reader module (cfmtrain.readers.<module>)
FORMATS: dict[str, str] = {
    ".extxyz": "extxyz",
    ".xyz": "extxyz",
    ".zip": "extxyz_zip",
    ".db": "ase_db",
    ".traj": "traj",
    ".json": "mptrj",
    ".json.gz": "mptrj",
}


def format_of(path: str | os.PathLike) -> str:
    """The reader module of a file, by its suffix; ValueError naming the known suffixes."""
    name = Path(path).name.lower()
    # the end of the name, any case; the longest suffix first (`.json.gz` before any `.gz`)
    for suffix in sorted(FORMATS, key=len, reverse=True):
        if name.endswith(suffix):
            return FORMATS[suffix]
    raise ValueError(f"{path}: unknown suffix {Path(path).suffix!r} (known: "
                     f"{', '.join(FORMATS)})")


def is_known(path: str | os.PathLike) -> bool:
    """True if a reader reads the file, by its suffix."""
    try:
        format_of(path)
    except ValueError:
        return False
    return True


def suffixes(module: str) -> tuple[str, ...]:
    """The suffixes read by one reader module."""
    return tuple(suffix for suffix, name in FORMATS.items() if name == module)
