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


def _map(folder: Path) -> dict[str, np.ndarray]:
    names = json.loads((folder / COMPLETE).read_text())["names"]
    return {k: np.load(folder / f"{k}.npy", mmap_mode="c") for k in names}


def shared_arrays(store_folder: Path, key: str,
                  make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays of `key`, memory-mapped from the store's cache (made by `make` and written by
    the first rank to get here). A folder that cannot be written gives `make()`'s arrays
    in this process's own memory."""
    folder = cache_folder(store_folder, key)
    if (folder / COMPLETE).is_file():
        return _map(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock = open(folder.parent / f"{folder.name}.lock", "w")
    except OSError:
        return make()
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / COMPLETE).is_file():
            _write(folder, make(), key)
        return _map(folder)


def _write(folder: Path, arrays: dict[str, np.ndarray], key: str) -> None:
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for name, value in arrays.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(value))
        (tmp / COMPLETE).write_text(json.dumps({"key": key, "names": list(arrays)}))
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(folder)  # an incomplete one (no COMPLETE file)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
