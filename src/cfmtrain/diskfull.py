"""Writes that fail for want of space: one error that names the file and says the disk (or the
quota, or the process's file-size limit) is full, instead of a bare `No space left on device`
naming no path. Every atomic write (atomic.atomic_path) goes through it.
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
def writing(path: str | os.PathLike, then: str = "run again") -> Iterator[None]:
    """Turn a disk-full OSError raised in the block into DiskFullError naming `path`; the
    message ends with `then`, what to do once there is room."""
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
            f"in {folder} (or write elsewhere) and {then}")) from err
