"""Where a graph shard and a split come from, recorded when they are written, checked on use.

A shard's provenance: its data set, the cutoff, the sha256 of the frames file it was built from
and of the frames folder's manifest.json (which records the input files' sha256, or the
generator's settings). Its `id` hashes them. A store's fingerprint hashes its shards' ids in
order; a split records the fingerprint of the store it split, and a checkpoint the fingerprints
of the store and split it trained on.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from cfmtrain.digest import file_digest
from cfmtrain.shards.writer import MANIFEST


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def shard_provenance(frames: str | os.PathLike, dataset: str | None, cutoff: float) -> dict:
    """The provenance record of a shard built from the extxyz file `frames` at `cutoff`; the
    data set defaults to the frames manifest's, else the name of the frames folder's parent
    (results/data/<set>/frames)."""
    frames = Path(frames)
    manifest = frames.parent / MANIFEST
    inputs = file_digest(manifest) if manifest.is_file() else None
    if dataset is None and inputs is not None:
        dataset = json.loads(manifest.read_text()).get("dataset")
    record = {"dataset": dataset or frames.resolve().parent.parent.name,
              "cutoff": float(cutoff), "frames": frames.name,
              "frames_sha256": file_digest(frames), "inputs_sha256": inputs}
    return {**record, "id": _digest(record)}


def table_id(table: dict[str, np.ndarray], energy: np.ndarray, cutoff: float) -> str:
    """The id of a shard without a recorded provenance (written by hand): a hash of its
    per-graph table and energies, which a changed data set changes."""
    digest = hashlib.sha256(f"{float(cutoff)!r}".encode())
    for array in (table["num_atoms"], table["num_edges"], table["subsets"], energy):
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def fingerprint(ids: list[str]) -> str:
    """A store's fingerprint from its shards' ids, in order."""
    return _digest(ids)


def split_digest(parts: dict[str, np.ndarray]) -> str:
    """The fingerprint of a split's index arrays."""
    digest = hashlib.sha256()
    for name in sorted(parts):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(parts[name], np.int64).tobytes())
    return digest.hexdigest()
