"""`cfmtrain bench graphs`: radius-graph construction throughput, end to end against peers.

End to end = validation + vesin neighbour list + HDF5 shard written; peers compute only the
neighbour list (ASE, matscipy, vesin) on the same in-memory structures.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from ase import Atoms

PRESETS = {"quick": {"scale": 0.25, "repeats": 3}, "full": {"scale": 2.0, "repeats": 5}}


def _ase(frames: list[Atoms], cutoff: float) -> int:
    from ase.neighborlist import neighbor_list

    return sum(len(neighbor_list("i", a, cutoff)) for a in frames)


def _matscipy(frames: list[Atoms], cutoff: float) -> int:
    from matscipy.neighbours import neighbour_list

    return sum(len(neighbour_list("i", a, cutoff)) for a in frames)


def _vesin(frames: list[Atoms], cutoff: float) -> int:
    from cfmtrain.graphs.neighbors import radius_graph

    return sum(radius_graph(a.positions, a.cell.array, a.pbc, cutoff).lengths.size
               for a in frames)


def _end_to_end(frames: list[Atoms], cutoff: float) -> int:
    import collections

    from cfmtrain.graphs.build import build_graphs
    from cfmtrain.graphs.store import GraphStore, write_shard

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "shard_0000.h5"
        write_shard(path, build_graphs(frames, "bench", cutoff, False, collections.Counter()),
                    cutoff=cutoff)
        return int(GraphStore(path).num_edges.sum())


PEERS: dict[str, Callable[[list[Atoms], float], int]] = {
    "ase.neighbor_list": _ase, "matscipy.neighbour_list": _matscipy,
    "vesin (alone)": _vesin, "cfmtrain end-to-end (HDF5)": _end_to_end,
}


def measure(frames: list[Atoms], cutoff: float, repeats: int) -> list[dict]:
    """Median time of each method over `repeats` runs on the same frames."""
    rows, vesin_rate = [], None
    for name, fn in PEERS.items():
        fn(frames[:5], cutoff)  # warm-up (imports, first allocations)
        times, edges = [], 0
        for _ in range(repeats):
            start = time.perf_counter()
            edges = fn(frames, cutoff)
            times.append(time.perf_counter() - start)
        seconds = float(np.median(times))
        rate = len(frames) / seconds
        vesin_rate = rate if name == "vesin (alone)" else vesin_rate
        rows.append({"method": name, "graphs": len(frames), "edges": edges,
                     "median_s": seconds, "graphs_per_s": rate, "edges_per_s": edges / seconds})
    for row in rows:
        row["vs_vesin"] = row["graphs_per_s"] / vesin_rate
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain bench graphs`."""
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument("--cutoff", type=float, default=4.5)
    parser.add_argument("--output", type=Path, default=None,
                        help="CSV (default results/bench/graphs_<preset>.csv)")


def run(args: argparse.Namespace) -> int:
    """Generate the `mini` structures in memory, time every method, print and write the table."""
    from cfmtrain.bench.table import report
    from cfmtrain.data.mini import iter_mini_frames

    preset = PRESETS[args.preset]
    frames = list(iter_mini_frames(scale=preset["scale"], seed=0))
    rows = measure(frames, args.cutoff, preset["repeats"])
    output = args.output or Path(f"results/bench/graphs_{args.preset}.csv")
    report(rows, output, f"Graph construction, {len(frames)} mini graphs, cutoff {args.cutoff} Å"
           f" (median of {preset['repeats']})")
    return 0
