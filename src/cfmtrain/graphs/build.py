"""`cfmtrain graphs`: frames of one extxyz shard -> radius graphs -> one HDF5 graph shard.

Frames are read by cfmtrain's extxyz reader (errors name file, frame and line) and validated;
a bad or unreadable frame is an error naming file, frame and reason, or with
--skip-invalid it is skipped and counted in a JSON report beside the shard. The same holds for a
frame whose graph is refused (a periodic cell so small that its graph would not fit in memory).
The report also holds the shard's manifest counts (graphs, atoms, edges) and the graphs
without an edge; a shard none of whose structures of two or more atoms has an edge is refused
(the cutoff is below every interatomic distance). The shard records its provenance (data set,
cutoff, the frames file's and the conversion manifest's sha256), which the store checks.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from ase import Atoms
from ase.stress import voigt_6_to_full_3x3_stress
from tqdm import tqdm

from cfmtrain import crash
from cfmtrain.atomic import atomic_path
from cfmtrain.frames.extxyz import iter_extxyz
from cfmtrain.frames.labels import CONFIG_TYPE_KEY, KEYS
from cfmtrain.frames.neighbors import GraphTooLargeError, check_cutoff, radius_graph
from cfmtrain.frames.validate import (
    LIMITS,
    MIN_DISTANCE,
    InvalidFrameError,
    Limits,
    Problem,
    atoms_problems,
)
from cfmtrain.graphs.provenance import shard_provenance
from cfmtrain.graphs.store import open_shard, shard_table, write_shard
from cfmtrain.paper import CUTOFF

NO_EDGES = "graphs without edges"  # counted, not skipped: a dissociated dimer is valid data
CHUNK = 128  # frames validated together: the checks are vectorised over a chunk's arrays


def atoms_to_graph(atoms: Atoms, cutoff: float, keys: dict[str, str] = KEYS) -> dict:
    """One labelled structure as a graph dict in GraphStore's fields (without validation)."""
    arrays, info, cell, pbc = atoms.arrays, atoms.info, atoms.cell.array, atoms.pbc
    graph = radius_graph(arrays["positions"], cell, pbc, cutoff)
    stress = info.get(keys["stress"])
    if stress is not None:
        stress = np.asarray(stress, dtype=np.float64)
        stress = voigt_6_to_full_3x3_stress(stress) if stress.size == 6 else stress.reshape(3, 3)
    return {
        "positions": arrays["positions"], "numbers": arrays["numbers"], "cell": cell, "pbc": pbc,
        "edge_index": graph.edge_index, "unit_shifts": graph.unit_shifts,
        "energy": float(info[keys["energy"]]), "forces": arrays[keys["forces"]],
        "stress": stress, "subset": str(info.get(CONFIG_TYPE_KEY, "default")),
        "min_length": graph.min_length,
    }


def read_frames(source: Path) -> Iterator[Atoms | Problem]:
    """The frames of an extxyz file in order: Atoms, or (reason, detail) for one whose lines
    are there but unreadable. Lost frame boundaries or an empty file raise, naming the file."""
    with open(source, encoding="utf-8") as fh:
        for _, atoms, problem in iter_extxyz(fh, str(source)):
            yield atoms if problem is None else problem


def frames_limits(source: Path) -> Limits:
    """The label limits the frames of `source` were converted under (their folder's
    manifest.json, written by `cfmtrain convert`), else the defaults."""
    manifest = source.parent / "manifest.json"
    if not manifest.is_file():
        return LIMITS
    try:
        limits = json.loads(manifest.read_text()).get("limits")
    except (json.JSONDecodeError, AttributeError) as err:
        raise ValueError(f"{manifest}: not a frames manifest ({err})") from None
    return Limits(**limits) if limits else LIMITS


def build_graphs(frames: Iterable[Atoms | Problem], source: str, cutoff: float,
                 skip_invalid: bool, skipped: collections.Counter, keys: dict[str, str] = KEYS,
                 chunk_size: int = CHUNK, limits: Limits = LIMITS) -> Iterator[dict]:
    """Validate and convert frames; invalid ones (or a reader's (reason, detail) in place of a
    frame) raise or, with skip_invalid, are counted. `skipped["graphs without edges"]` counts
    the structures that could have an edge (two or more atoms, or periodic) without one within
    the cutoff; if that is every one of them, a ValueError naming the cutoff ends the generator
    (no shard is written).

    Frames are validated `chunk_size` at a time, then turned into graphs in order, so the error
    (or skip) is always that of the first invalid frame, as with one frame at a time."""
    frames = iter(frames)
    index = 0
    several = 0  # graphs that could have an edge: two or more atoms, or periodic
    while chunk := list(itertools.islice(frames, chunk_size)):
        readable = [a for a in chunk if isinstance(a, Atoms)]
        checked = iter(atoms_problems(readable, source, index, keys=keys, check_overlap=False,
                                      limits=limits))
        for atoms, problem in zip(chunk, (next(checked) if isinstance(a, Atoms) else a
                                          for a in chunk), strict=True):
            graph = None
            crash.at("building radius graphs", source, index)
            if problem is None:
                try:
                    graph = atoms_to_graph(atoms, cutoff, keys)
                except GraphTooLargeError as err:
                    problem = (err.reason, err.detail)
            if problem is None:
                # the overlap check reuses the radius graph's shortest edge (no second search)
                if (shortest := graph.pop("min_length")) < MIN_DISTANCE:
                    problem = ("overlapping atoms", f"two atoms (or an atom and a periodic "
                               f"image) {shortest:.4g} A apart, minimum {MIN_DISTANCE} A")
            if problem is None:
                graph["source_index"] = index
                if len(graph["numbers"]) > 1 or any(graph["pbc"]):
                    several += 1
                    if graph["edge_index"].shape[1] == 0:
                        skipped[NO_EDGES] += 1
                yield graph
            elif skip_invalid:
                skipped[problem[0]] += 1
            else:
                raise InvalidFrameError(source, index, *problem)
            index += 1
    if several and skipped[NO_EDGES] == several:
        raise ValueError(f"{source}: none of its {several} structures (of two or more atoms, or "
                         f"periodic) has an edge: the cutoff {cutoff} A is below every "
                         "interatomic distance (config `cutoff`, `cfmtrain graphs --cutoff`)")


def build_shard(source: Path, output: Path, cutoff: float, skip_invalid: bool = False,
                dataset: str | None = None) -> dict:
    """Build one HDF5 shard from one extxyz file; returns the report (graphs, skipped by reason,
    graphs without edges, provenance)."""
    check_cutoff(cutoff)
    counts: collections.Counter = collections.Counter()
    frames = tqdm(read_frames(source), desc=f"graphs {source.name}", unit="frame",
                  mininterval=2.0)
    graphs = build_graphs(frames, str(source), cutoff, skip_invalid, counts,
                          limits=frames_limits(source))
    provenance = shard_provenance(source, dataset, cutoff)
    count = write_shard(output, graphs, cutoff=cutoff,
                        attrs={"source": str(source), "provenance": json.dumps(provenance)})
    shard_table(output)  # verified once here, and stamped: later opens read the stamp alone
    with open_shard(output) as f:
        manifest = json.loads(f.attrs["manifest"])
    no_edges = counts.pop(NO_EDGES, 0)
    return {"source": str(source), "output": str(output), "cutoff": cutoff, "graphs": count,
            "atoms": manifest["atoms"], "edges": manifest["edges"],
            "unit_shifts": manifest["unit_shifts"], "graphs_without_edges": no_edges,
            "skipped": sum(counts.values()), "skipped_by_reason": dict(counts),
            "provenance": provenance}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain graphs`."""
    parser.add_argument("--input", type=Path, required=True, help="extxyz shard of frames")
    parser.add_argument("--output", type=Path, required=True, help="HDF5 graph shard to write")
    parser.add_argument("--cutoff", type=float, default=CUTOFF, help="radius cutoff in Å")
    parser.add_argument("--dataset", help="data set recorded in the shard's provenance (default: "
                        "the frames manifest's, else the frames folder's parent's name)")
    parser.add_argument("--skip-invalid", action="store_true", help="skip and count bad frames")
    parser.add_argument("--report", type=Path, help="JSON report (default: <output>.json)")


def run(args: argparse.Namespace) -> int:
    """Build the shard and write its report; a bad frame, cutoff or input is a one-line error."""
    try:
        report = build_shard(args.input, args.output, args.cutoff, args.skip_invalid,
                             args.dataset)
    except (InvalidFrameError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    with atomic_path(args.report or args.output.with_suffix(".json")) as tmp:
        tmp.write_text(json.dumps(report, indent=2))
    edgeless = report["graphs_without_edges"]
    print(f"{args.output}: {report['graphs']} graphs, {report['skipped']} skipped"
          + (f", {edgeless} without an edge within {args.cutoff} A (of two or more atoms, or "
             "periodic)" if edgeless else ""))
    return 0
