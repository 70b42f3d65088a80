"""Arrays held once per node: written once as .npy files beside the store, memory-mapped by
every rank.

The first rank to need a set of arrays (named by a key, e.g. the store's fingerprint and the
model's precision) computes them and writes them under `<store>/.batch_arrays/<digest>/`, in a
temporary folder renamed when complete, while holding a lock file; the other ranks wait for the
lock and map the same files. The mapped pages live in the page cache, shared by all ranks of a
node (their PSS splits them) and evicted under pressure like any file's. Mapped copy-on-write:
writable for torch.from_numpy, never written back.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

FOLDER = ".batch_arrays"
COMPLETE = "arrays.json"  # the names, written last


def cache_folder(store_folder: Path, key: str) -> Path:
    """Where the arrays of `key` live for a store in `store_folder`."""
    return store_folder / FOLDER / hashlib.sha256(key.encode()).hexdigest()[:24]


Parts = dict[str, Callable[[], dict[str, np.ndarray]]]  # each call returns some of the arrays


def merge_parts(parts: Parts) -> dict[str, np.ndarray]:
    """Every part's arrays, computed at once."""
    return {k: v for part in parts.values() for k, v in part().items()}


def _map(folder: Path) -> dict[str, np.ndarray]:
    names = json.loads((folder / COMPLETE).read_text())["names"]
    return {k: np.load(folder / f"{k}.npy", mmap_mode="c") for k in names}


def shared_arrays(store_folder: Path, key: str, parts: Parts, group: str = ""
                  ) -> dict[str, np.ndarray]:
    """The arrays of `key`, memory-mapped from the store's cache. The first rank to get here
    computes them part by part (each call of `parts` returns some of them) and writes each
    before the next, so it holds one part at a time; it then removes the cached arrays of
    other groups (a store rebuilt since: another fingerprint). Where the files cannot be
    written, the arrays are kept in this process's own memory."""
    folder = cache_folder(store_folder, key)
    if (folder / COMPLETE).is_file():
        return _map(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock = open(folder.parent / f"{folder.name}.lock", "w")
    except OSError:
        return merge_parts(parts)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / COMPLETE).is_file():
            try:
                _write(folder, parts, key, group)
            except OSError:  # a full or read-only disk: this process keeps its own
                return merge_parts(parts)
        return _map(folder)


def _write(folder: Path, parts: Parts, key: str, group: str) -> None:
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    names = []
    try:
        for part in parts.values():
            for name, value in part().items():  # one part in memory at a time
                np.save(tmp / f"{name}.npy", np.ascontiguousarray(value))
                names.append(name)
        (tmp / COMPLETE).write_text(json.dumps({"key": key, "group": group, "names": names}))
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(folder)  # an incomplete one (no COMPLETE file)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for other in folder.parent.glob(f"*/{COMPLETE}"):  # mapped files outlive their removal
        with contextlib.suppress(OSError, ValueError):
            if json.loads(other.read_text()).get("group") != group:
                shutil.rmtree(other.parent)
                (other.parent.parent / f"{other.parent.name}.lock").unlink(missing_ok=True)
