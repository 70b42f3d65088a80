"""Structures that two members of a union share, found before the union is split: a structure
in two members would otherwise be two graphs that the split may put into different parts (a
copy of a test graph trained on).

A structure's key hashes its atomic numbers, positions and cell (rounded to 1e-6 Å, so that two
writings of one structure agree) and its periodicity. Members' shared input files are found as
one files set's repeated files are (cfmtrain.shards.writer.unique_files): by the sha256 that each
member's frames manifest records of its inputs, which a file listed twice, linked or copied
under another name has alike.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np

from cfmtrain.graphs.store import GraphStore, open_shard, shard_files
from cfmtrain.shards.writer import MANIFEST

DECIMALS = 6  # positions and cell rounded to 1e-6 Å before hashing
FIELDS = ("numbers", "positions", "cell", "pbc")


@dataclasses.dataclass(frozen=True)
class Shared:
    """Structures of member `later` whose copy member `first` holds (members as folders)."""

    first: Path
    later: Path
    structures: int
    files: list[tuple[str, str]]  # (first's input, later's input) of equal sha256


def structure_keys(store: GraphStore) -> list[bytes]:
    """Each graph's structure key, in store order."""
    keys = [b""] * len(store)
    for selected, block in store.graph_blocks(np.arange(len(store)), FIELDS):
        starts = np.concatenate([[0], np.cumsum(block["num_atoms"])])
        positions = np.round(block["positions"], DECIMALS) + 0.0  # + 0.0: -0.0 becomes 0.0
        cells = np.round(block["cell"], DECIMALS) + 0.0
        numbers = block["numbers"].astype(np.uint8)
        for k in selected:
            digest = hashlib.blake2b(digest_size=16)
            for part in (numbers[starts[k]:starts[k + 1]], positions[starts[k]:starts[k + 1]],
                         cells[k], block["pbc"][k]):
                digest.update(np.ascontiguousarray(part).tobytes())
            keys[int(block["first"]) + int(k)] = digest.digest()
    return keys


def later_copies(keys: list[bytes], member_of: np.ndarray) -> np.ndarray:
    """Mask of the graphs whose structure an earlier member holds (the first member listed
    keeps a shared structure; repeats within one member are that member's own)."""
    owner: dict[bytes, int] = {}
    copies = np.zeros(len(keys), bool)
    for i, key in enumerate(keys):
        copies[i] = owner.setdefault(key, int(member_of[i])) != member_of[i]
    return copies


def input_sources(folder: Path) -> list[dict]:
    """The input files (path, sha256) of the conversion a member's graphs were built from: the
    frames manifest beside the frames file its first shard records; [] if there is none."""
    files = shard_files(folder)
    if not files:
        return []
    with open_shard(files[0]) as f:
        source = f.attrs.get("source")
    manifest = Path(str(source)).parent / MANIFEST if source is not None else None
    if manifest is None or not manifest.is_file():
        return []
    try:
        return list(json.loads(manifest.read_text()).get("sources", []))
    except (json.JSONDecodeError, AttributeError):
        return []


def shared_structures(folders: list[Path], store: GraphStore) -> tuple[np.ndarray, list[Shared]]:
    """(mask of the graphs to leave out of the union's split: the later copies of structures
    that several members hold; what each pair of members shares) for the union of `folders`
    read as `store`."""
    sizes = [len(GraphStore(folder, check_edges=False)) for folder in folders]
    member_of = np.repeat(np.arange(len(folders)), sizes)
    keys = structure_keys(store)
    copies = later_copies(keys, member_of)
    owner: dict[bytes, int] = {}
    for key, member in zip(keys, member_of, strict=True):
        owner.setdefault(key, int(member))
    counts: dict[tuple[int, int], int] = {}
    for i in np.flatnonzero(copies):
        pair = (owner[keys[i]], int(member_of[i]))
        counts[pair] = counts.get(pair, 0) + 1
    sources = [input_sources(folder) for folder in folders]
    shared = []
    for (a, b), n in sorted(counts.items()):
        by_digest = {s["sha256"]: s["path"] for s in sources[a]}
        files = [(by_digest[s["sha256"]], s["path"]) for s in sources[b]
                 if s["sha256"] in by_digest]
        shared.append(Shared(folders[a], folders[b], n, files))
    return copies, shared


def describe(shared: Shared) -> str:
    """A warning naming both members, the count and the shared input files."""
    files = "; ".join(first if first == later else f"{later} (the same content as {first})"
                      for first, later in shared.files)
    return (f"union members {shared.first} and {shared.later} share {shared.structures} "
            "structure(s) (identical atoms, positions and cell)"
            + (f", from the input file(s) {files}" if files else "")
            + f": the copies in {shared.later} are left out of the split (train, valid and "
            "test), so that no structure is in two parts")
