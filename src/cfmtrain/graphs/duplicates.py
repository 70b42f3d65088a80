"""Structures held more than once, found before a split: in one data set (a file and a zip
holding it, repeated frames) or in several members of a union. A structure held twice would be
two graphs that the split may put into different parts (a copy of a test graph trained on), so
every copy after the first (in store order: members as listed) is left out.

Copies are found by cfmtrain.graphs.structure_keys: the same atoms up to their order, wrapping
into the cell, lattice translations and a shift along open directions, within rounding. The
warnings name the members and where the inputs tell: members' shared input files by the sha256
that each frames manifest records of its inputs (a file listed twice, linked or copied under
another name has alike, as cfmtrain.shards.writer.unique_files finds one set's repeated files),
and for copies within one data set the input files that hold them, from the count of frames the
manifest records for each file (frames are dealt round-robin into the shards in input order).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np

from cfmtrain.graphs.store import GraphStore, open_shard, shard_files
from cfmtrain.graphs.structure_keys import first_holders, structure_keys
from cfmtrain.shards.writer import MANIFEST

SAME = "the same atoms up to their order, wrapping into the cell and translation"
SHOWN = 5  # file pairs named in a warning


@dataclasses.dataclass(frozen=True)
class Shared:
    """Structures of member `later` whose copy member `first` holds (members as folders; the
    same folder for copies within one data set)."""

    first: Path
    later: Path
    structures: int
    files: list[tuple[str, str]]  # (first's input, later's input) holding the copies


def _manifest(shard: Path) -> tuple[dict, int | None]:
    """(the frames manifest of the conversion a graph shard was built from, the shard's
    frames file number); ({}, None) if there is none."""
    with open_shard(shard) as f:
        source = f.attrs.get("source")
    if source is None:
        return {}, None
    path = Path(str(source))
    number = re.fullmatch(r"frames_(\d+)\.extxyz", path.name)
    try:
        manifest = json.loads((path.parent / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}, None
    return (manifest if isinstance(manifest, dict) else {}), (
        int(number.group(1)) if number else None)


def input_sources(folder: Path) -> list[dict]:
    """The input files (path, sha256, frames) of the conversion a member's graphs were built
    from: the frames manifest beside the frames file its first shard records; [] if none."""
    files = shard_files(folder)
    return list(_manifest(files[0])[0].get("sources", [])) if files else []


def input_files(store: GraphStore, indices: np.ndarray) -> dict[int, str]:
    """The input file each of the graphs `indices` was converted from, where its manifest
    records each file's frames (frame j of the conversion is frame j // S of frames file
    j % S, for S shards)."""
    found: dict[int, str] = {}
    indices = np.unique(np.asarray(indices, np.int64))
    shards = store.shard_of(indices)
    for shard in np.unique(shards).tolist():
        manifest, number = _manifest(store.files[shard])
        sources = manifest.get("sources", [])
        if number is None or not sources or any("frames" not in s for s in sources):
            continue
        ends = np.cumsum([s["frames"] for s in sources])
        mine = indices[shards == shard]
        for selected, block in store.graph_blocks(mine, ["source_index"]):
            frames = block["source_index"][selected] * int(manifest["num_shards"]) + number
            which = np.searchsorted(ends, frames, side="right")
            for graph, k in zip(block["first"] + selected, which, strict=True):
                if k < len(sources):
                    found[int(graph)] = str(sources[k]["path"])
    return found


def _pairs(files: dict[int, str], graphs: list[tuple[int, int]]) -> list[tuple[str, str]]:
    """The distinct (first's file, copy's file) of (first, copy) graph pairs, where known."""
    seen = {(files[a], files[b]) for a, b in graphs if a in files and b in files}
    return sorted(seen)


def shared_structures(folders: list[Path], store: GraphStore) -> tuple[np.ndarray, list[Shared]]:
    """(mask of the graphs to leave out of the split: the copies of structures that an earlier
    graph holds; what each member shares with itself or an earlier member) for the store of
    `folders` (one data set, or a union's members in order) read as `store`."""
    sizes = [len(GraphStore(folder, check_edges=False)) for folder in folders]
    member_of = np.repeat(np.arange(len(folders)), sizes)
    first = first_holders(structure_keys(store))
    copies = first != np.arange(len(store))
    later = np.flatnonzero(copies)
    by_pair: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for copy, held in zip(later.tolist(), first[later].tolist(), strict=True):
        by_pair.setdefault((int(member_of[held]), int(member_of[copy])), []).append((held, copy))
    within = [g for (a, b), pairs in by_pair.items() if a == b for pair in pairs for g in pair]
    files = input_files(store, np.array(within, np.int64)) if within else {}
    sources = [input_sources(folder) for folder in folders]
    shared = []
    for (a, b), graphs in sorted(by_pair.items()):
        if a == b:
            named = _pairs(files, graphs)
        else:
            by_digest = {s["sha256"]: s["path"] for s in sources[a]}
            named = [(by_digest[s["sha256"]], s["path"]) for s in sources[b]
                     if s["sha256"] in by_digest]
        shared.append(Shared(folders[a], folders[b], len(graphs), named))
    return copies, shared


def _files(pairs: list[tuple[str, str]], within: bool) -> str:
    """The input files of a warning, a few at most."""
    if within:
        text = [f"{first} (repeated within it)" if first == later
                else f"{later} (copies of structures of {first})" for first, later in pairs]
    else:
        text = [first if first == later else f"{later} (the same content as {first})"
                for first, later in pairs]
    more = f" and {len(text) - SHOWN} more" if len(text) > SHOWN else ""
    return "; ".join(text[:SHOWN]) + more


def describe(shared: Shared) -> str:
    """A warning naming the member(s), the count and the input files holding the copies."""
    files = _files(shared.files, shared.first == shared.later)
    where = f", in the input file(s) {files}" if files else ""
    if shared.first == shared.later:
        return (f"data set {shared.first} holds {shared.structures} structure(s) more than once "
                f"({SAME}){where}: the later copies are left out of the split (train, valid "
                "and test), so that no structure is in two parts")
    return (f"union members {shared.first} and {shared.later} share {shared.structures} "
            f"structure(s) ({SAME})"
            + (f", from the input file(s) {files}" if files else "")
            + f": the copies in {shared.later} are left out of the split (train, valid and "
            "test), so that no structure is in two parts")
