"""Writes of a run's outputs that fail for want of space (cfmtrain.diskfull), with how the run
goes on, and torch's `unexpected pos` traced back to its errno.

The writers leave no partial file: the atomic ones (atomic.atomic_path) remove their temporary
file, an append is cut back to where it began, and a checkpoint that cannot be written leaves
the previous ones as they were.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from cfmtrain.diskfull import FULL, DiskFullError  # noqa: F401  (re-exported for train)
from cfmtrain.diskfull import writing as base_writing

RESUME = "run again: --resume auto goes on from the last checkpoint written"


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """A run's output write: a disk-full OSError becomes DiskFullError naming `path`, with how
    the run goes on."""
    with base_writing(path, then=RESUME):
        yield


class Tracked:
    """A binary file object for torch.save that keeps the OSError of a failed write: torch
    reports it as a RuntimeError ('unexpected pos ...') without the errno; raise_kept()
    raises the original."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.file.flush()

    def raise_kept(self, cause: BaseException) -> None:
        """Raise the kept OSError of a write (from `cause`, torch's error), if there is one."""
        if self.error is not None:
            raise self.error from cause


def torch_save(obj: object, path: Path, sync: bool = False) -> None:
    """torch.save `obj` to the file `path` (flushed and, with `sync`, fsynced); a disk-full
    OSError raised as itself even where torch wraps it."""
    import torch  # lazy: the CSV and JSON writers need no torch

    with open(path, "wb") as f:
        tracked = Tracked(f)
        try:
            torch.save(obj, tracked)
        except RuntimeError as err:
            tracked.raise_kept(err)
            raise
        f.flush()
        if sync:
            os.fsync(f.fileno())


@contextlib.contextmanager
def appending(path: Path) -> Iterator[None]:
    """An append to `path` that fails is cut back to the file's length before it (a new file
    is removed), and a disk-full error names the file (writing)."""
    size = path.stat().st_size if path.exists() else None
    try:
        with writing(path):
            yield
    except BaseException:
        if size is None:
            path.unlink(missing_ok=True)
        elif path.exists():
            os.truncate(path, size)
        raise
