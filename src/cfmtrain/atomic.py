"""Atomic file output: write under a temporary name in the same folder, rename on success.

A failed or interrupted writer never leaves a file that looks complete, and one that fails for
want of space says so naming the file (cfmtrain.diskfull).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from cfmtrain import crash
from cfmtrain.diskfull import writing


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it to `path` only if the block succeeds."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    crash.leftover(tmp)
    try:
        with writing(final):
            yield tmp
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()
