"""Atomic file output: write under a temporary name in the same folder, rename on success.

A failed or interrupted writer never leaves a file that looks complete, and one that fails for
want of space says so naming the file (cfmtrain.diskfull). The temporary name holds the
writer's pid (`.NAME.tmp-PID`): the next writer of a file removes the temporary files of its
writers that are gone (no live process of that pid on this host), which a SIGKILL leaves.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator
from pathlib import Path

from cfmtrain import crash
from cfmtrain.children import pid_alive, writer_pid
from cfmtrain.diskfull import writing


def remove_dead_writers(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files (`.NAME.tmp-PID`) of `path`'s writers that are gone; the
    files removed."""
    final = Path(path)
    removed = []
    for stale in final.parent.glob(f".{glob.escape(final.name)}.tmp-*"):
        pid = writer_pid(stale)
        if pid is not None and pid != os.getpid() and not pid_alive(pid):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                stale.unlink()
                removed.append(stale)
    return removed


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it to `path` only if the block succeeds."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_writers(final)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    crash.leftover(tmp)
    try:
        with writing(final):
            yield tmp
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()
