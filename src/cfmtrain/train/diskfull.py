"""Writes of a run's outputs that fail for want of space: one error that names the file and says
the disk (or the quota, or the process's file-size limit) is full, instead of a bare
`No space left on device` or torch's `unexpected pos` naming no path.

The writers leave no partial file: the atomic ones (atomic.atomic_path) remove their temporary
file, an append is cut back to where it began, and a checkpoint that cannot be written leaves
the previous ones as they were.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

# no space on the device, a quota exceeded, a file over RLIMIT_FSIZE (ulimit -f)
FULL = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
        errno.EFBIG: "the file is over this process's file-size limit (ulimit -f)"}


class DiskFullError(OSError):
    """A file not written for want of space; the message names it and what is full."""

    def __str__(self) -> str:
        return self.args[1]


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Turn a disk-full OSError raised in the block into DiskFullError naming `path`."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as err:
        if err.errno not in FULL:
            raise
        folder = Path(path).parent
        raise DiskFullError(err.errno, (
            f"{path}: not written, {FULL[err.errno]} ({os.strerror(err.errno)}); free space "
            f"in {folder} (or write the run elsewhere) and run again: --resume auto goes on "
            "from the last checkpoint written")) from err


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
