"""Arrays held once per node: written once as .npy files beside the store, memory-mapped by
every rank.

The first rank to need a set of arrays (named by a key: what they derive from and how) computes
them and writes them under `<store>/.batch_arrays/<digest>/`, in a temporary folder renamed
when complete, while holding a lock file; the other ranks wait for the lock and map the same
files. The mapped pages live in the page cache, shared by all ranks of a node (their PSS splits
them) and evicted under pressure like any file's. Mapped copy-on-write: writable for
torch.from_numpy, never written back.

Integrity: `arrays.json`, written last, records each file's size and CRC-32 and the state
(size, times, inode) of every file the arrays derive from; files and folders are synced before
the rename that publishes them. Every map checks sizes and checksums (CRC-32 runs at about
3 GB/s); a cache that fails or cannot be loaded is removed and rebuilt, with one line naming
its folder. A writer removes the caches whose sources changed or vanished (a store rebuilt or
edited), those unused for UNUSED_DAYS and the temporary folders of writers that died; caches of
the same store reached through other unions, or derived by another cfmtrain, stay until then.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import mmap
import os
import shutil
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cfmtrain import crash
from cfmtrain.graphs.store import file_state

FOLDER = ".batch_arrays"
COMPLETE = "arrays.json"  # the parts' names, sizes, checksums and sources: written last
FORMAT = 2  # 2: checksums and sources in arrays.json
CRC_BLOCK = 1 << 26  # bytes checksummed per call: bounded pages touched at once
UNUSED_DAYS = 30  # a cache not mapped for this long is removed by the next writer beside it

Parts = dict[str, Callable[[], dict[str, np.ndarray]]]  # each call returns some of the arrays
Sources = dict[str, dict]  # path -> graphs.store.file_state of each file the arrays derive from


class CacheError(ValueError):
    """A cache folder that fails its checks; the message names the folder."""


def cache_folder(store_folder: Path, key: str, sources: Sources) -> Path:
    """Where the arrays of `key`, derived from `sources` as they are now, live."""
    text = json.dumps({"format": FORMAT, "key": key, "sources": sources}, sort_keys=True)
    return store_folder / FOLDER / hashlib.sha256(text.encode()).hexdigest()[:24]


def merge_parts(parts: Parts) -> dict[str, np.ndarray]:
    """Every part's arrays, computed at once."""
    return {k: v for part in parts.values() for k, v in part().items()}


def _note(message: str) -> None:
    print(f"cfmtrain: {message}", file=sys.stderr, flush=True)


def shared_arrays(store_folder: Path, key: str, parts: Parts, sources: Sources
                  ) -> dict[str, np.ndarray]:
    """The arrays of `key` derived from `sources`, memory-mapped from the store's cache after
    their checks. The first rank to get here computes them part by part (each call of `parts`
    returns some of them) and writes each before the next, so it holds one part at a time.
    Where the files cannot be written, the arrays are kept in this process's own memory (said
    in one line naming the folder)."""
    folder = cache_folder(store_folder, key, sources)
    if (folder / COMPLETE).is_file():
        try:
            return _map(folder, parts)
        except CacheError as err:
            _note(f"{err}: rebuilding it")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock = open(folder.parent / f"{folder.name}.lock", "w")
    except OSError as err:
        _note(f"{folder.parent}: cannot keep batch arrays there ({err.strerror}); this process "
              f"holds its own copy")
        return merge_parts(parts)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _remove_leftovers(folder)
        if (folder / COMPLETE).is_file():
            try:
                return _map(folder, parts)
            except CacheError:  # said above, or by the process that wrote it meanwhile
                shutil.rmtree(folder, ignore_errors=True)
        try:
            _write(folder, parts, key, sources)
        except OSError as err:
            _note(f"{folder}: cannot write batch arrays ({err.strerror}); this process holds "
                  f"its own copy")
            return merge_parts(parts)
        _remove_stale(folder)
        return _map(folder, parts)


def _crc(path: Path, size: int) -> int:
    """CRC-32 of the file's bytes, read through a map in blocks."""
    if size == 0:
        return 0
    crc = 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        for at in range(0, size, CRC_BLOCK):
            crc = zlib.crc32(view[at:at + CRC_BLOCK], crc)
        view.release()
    return crc


def _map(folder: Path, parts: Parts) -> dict[str, np.ndarray]:
    """The folder's arrays, mapped, after checking that it holds every array of `parts` and
    their sizes and checksums (CacheError naming the folder and file otherwise)."""
    try:
        record = json.loads((folder / COMPLETE).read_text())
        files = record["files"]
        listed = {name for names in record["parts"].values() for name in names}
        if set(record["parts"]) != set(parts) or listed != set(files):
            raise CacheError(f"{folder / COMPLETE}: lists parts {sorted(record['parts'])} and "
                             f"files {sorted(files)}, not the arrays of parts {sorted(parts)}")
        arrays = {}
        for name, (size, crc) in files.items():
            path = folder / f"{name}.npy"
            if path.stat().st_size != size:
                raise CacheError(f"{path}: {path.stat().st_size} bytes, written with {size}")
            if _crc(path, size) != crc:
                raise CacheError(f"{path}: checksum mismatch (damaged since it was written)")
            arrays[name] = np.load(path, mmap_mode="c")
        with contextlib.suppress(OSError):  # its last use, for the removal of unused ones
            os.utime(folder / COMPLETE)
        return arrays
    except CacheError as err:
        raise CacheError(f"batch-array cache {folder} is damaged ({err})") from None
    except (OSError, ValueError, KeyError, TypeError, EOFError) as err:
        raise CacheError(f"batch-array cache {folder} cannot be loaded ({err})") from None


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(folder: Path, parts: Parts, key: str, sources: Sources) -> None:
    """Write the arrays into a temporary folder, sync it, then rename it to `folder`."""
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    crash.leftover(tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    files, names = {}, {}
    try:
        for part_name, part in parts.items():
            names[part_name] = []
            for name, value in part().items():  # one part in memory at a time
                names[part_name].append(name)
                path = tmp / f"{name}.npy"
                with open(path, "wb") as f:
                    np.save(f, np.ascontiguousarray(value))
                    f.flush()
                    os.fsync(f.fileno())
                size = path.stat().st_size
                files[name] = (size, _crc(path, size))
        record = {"format": FORMAT, "key": key, "sources": sources, "parts": names,
                  "files": files}
        with open(tmp / COMPLETE, "w") as f:
            f.write(json.dumps(record))
            f.flush()
            os.fsync(f.fileno())
        _sync(tmp)
        shutil.rmtree(folder, ignore_errors=True)  # one that failed its checks
        os.replace(tmp, folder)
        _sync(folder.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _unlocked(lock: Path) -> bool:
    """True if no process holds `lock` (its writer finished or died); a missing lock file
    counts as free."""
    try:
        with open(lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def _remove_leftovers(folder: Path) -> None:
    """Remove temporary folders of writers that are gone (this key's lock is held, so any of
    its own are; another key's when its lock is free)."""
    for tmp in folder.parent.glob("*.tmp*"):
        name = tmp.name.split(".tmp")[0]
        if tmp.is_dir() and (name == folder.name
                             or _unlocked(folder.parent / f"{name}.lock")):
            shutil.rmtree(tmp, ignore_errors=True)


def _stale(folder: Path, record: dict) -> bool:
    """True if a cache is of another format, unused for UNUSED_DAYS, or its sources changed or
    vanished."""
    if record.get("format") != FORMAT:
        return True
    with contextlib.suppress(OSError):
        if time.time() - (folder / COMPLETE).stat().st_mtime > UNUSED_DAYS * 86400:
            return True
    try:
        return any(file_state(p) != s for p, s in record["sources"].items())
    except (OSError, KeyError, AttributeError):
        return True


def _remove_stale(folder: Path) -> None:
    """Remove the caches beside `folder` derived from files that changed or vanished, unused
    for long, or of an older format (mapped files outlive their removal)."""
    for other in folder.parent.iterdir():
        if not other.is_dir() or other == folder or ".tmp" in other.name:
            continue
        try:
            record = json.loads((other / COMPLETE).read_text())
        except (OSError, ValueError):
            record = {}
        if _stale(other, record) and _unlocked(folder.parent / f"{other.name}.lock"):
            shutil.rmtree(other, ignore_errors=True)
            (folder.parent / f"{other.name}.lock").unlink(missing_ok=True)
