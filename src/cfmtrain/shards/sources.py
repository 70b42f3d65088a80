"""A conversion's input files by content: what a frames manifest records of each (path, size,
sha256 and stamp; its `sources`, and `e0s_file` for E0s read from a file), and which inputs hold
other content than recorded.

Snakemake reruns a step when an input's modification time moves past its output's; an edit that
keeps or sets back that time (`touch -r`, `rsync -t`, a restored backup) goes unseen. Any write
moves the file's change time (ctime), which no user call sets: a file is hashed again only when
its stamp (size, modification and change times, inode) differs from the one recorded, so an
unchanged input costs one stat, and a touched one one read (then remembered in a cache).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cfmtrain.atomic import atomic_path
from cfmtrain.digest import file_digest


def stamp(path: str | os.PathLike) -> list[int]:
    """What any write to a file changes: [size, mtime_ns, ctime_ns, inode]."""
    info = os.stat(path)
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def stamped_digest(path: str | os.PathLike) -> tuple[str, list[int]]:
    """(sha256, stamp) of a file, the stamp taken before the read and the file read again if
    it moved meanwhile: a recorded stamp never vouches for other content than its digest."""
    while True:
        before = stamp(path)
        digest = file_digest(path)
        if stamp(path) == before:
            return digest, before


def source_record(path: str | os.PathLike) -> dict:
    """A manifest's record of one input file: path, bytes, sha256 and stamp."""
    digest, now = stamped_digest(path)
    return {"path": str(path), "bytes": now[0], "sha256": digest, "stamp": now}


def recorded_inputs(manifest: dict) -> list[dict]:
    """The input files a frames manifest records: its sources and an E0s file."""
    return [*manifest.get("sources", []), *([manifest["e0s_file"]] if "e0s_file" in manifest
                                            else [])]


def _read_cache(cache: Path | None) -> dict:
    try:
        found = json.loads(cache.read_text()) if cache else {}
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def changed_inputs(manifest_path: str | os.PathLike, cache: Path | None = None) -> list[str]:
    """The input files that the frames manifest at `manifest_path` records and that exist with
    other content now, by their recorded paths ([] without a manifest). `cache` (a JSON file)
    remembers the sha256 of files whose stamp moved since the manifest, by real path and stamp,
    so that a touched file is read once, not at every check."""
    try:
        manifest = json.loads(Path(manifest_path).read_text())
    except (OSError, ValueError):
        return []
    known = _read_cache(cache)
    learned: dict[str, dict] = {}
    changed = []
    for entry in recorded_inputs(manifest if isinstance(manifest, dict) else {}):
        path = entry.get("path")
        try:
            now = stamp(path)
        except (OSError, TypeError):
            continue  # gone: the workflow's input list has changed, which Snakemake sees
        if now == entry.get("stamp"):
            continue
        real = os.path.realpath(path)
        remembered = known.get(real, {})
        if remembered.get("stamp") == now:
            digest = remembered.get("sha256")
        else:
            digest, now = stamped_digest(path)
            learned[real] = {"stamp": now, "sha256": digest}
        if digest != entry.get("sha256"):
            changed.append(str(path))
    if learned and cache is not None:
        with atomic_path(cache) as tmp:  # several processes: the last one's entries stay
            tmp.write_text(json.dumps(known | learned))
    return changed
