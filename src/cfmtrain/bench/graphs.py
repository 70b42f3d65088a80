"""`cfmtrain bench graphs`: radius-graph construction throughput, end to end against peers.

End to end = validation + vesin neighbour list + HDF5 shard written; peers compute only the
neighbour list (ASE, matscipy, vesin) on the same in-memory structures.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from ase import Atoms

from cfmtrain.bench.settings import BenchSettings
from cfmtrain.bench.table import report
from cfmtrain.graphs.build import build_graphs
from cfmtrain.graphs.store import GraphStore, write_shard
from cfmtrain.measure.paired import Ratio, run_rounds
from cfmtrain.paper import CUTOFF
from cfmtrain.settings import add_settings, from_args, setting
from cfmtrain.sources.mini import iter_mini_frames

# copies: the generated structures are repeated so that a shard holds as many graphs as a real
# one would and per-file costs are amortised as they are in the pipeline (same input for all)
PRESETS = {"quick": {"scale": 0.1, "copies": 5, "repeats": 5},
           "full": {"scale": 1.0, "copies": 4, "repeats": 5}}


def _ase(frames: list[Atoms], cutoff: float) -> int:
    from ase.neighborlist import neighbor_list

    return sum(len(neighbor_list("i", a, cutoff)) for a in frames)


def _matscipy(frames: list[Atoms], cutoff: float) -> int:
    from matscipy.neighbours import neighbour_list

    total = 0
    for a in frames:
        if not a.pbc.any():  # matscipy needs an invertible cell even for open clusters
            a = a.copy()
            a.cell = np.diag(np.ptp(a.positions, axis=0) + 2 * cutoff)
        total += len(neighbour_list("i", a, cutoff))
    return total


def _vesin(frames: list[Atoms], cutoff: float) -> int:
    import vesin

    # exactly the call cfmtrain's radius_graph makes (sorted, one thread, pairs + shifts +
    # lengths as views without a copy), with nothing around it: the fastest use of vesin
    nl = vesin.NeighborList(cutoff=cutoff, full_list=True, sorted=True, n_threads=1)
    return sum(len(nl.compute(a.positions, a.cell.array if a.pbc.any() else np.zeros((3, 3)),
                              a.pbc, "PSd", copy=False)[0]) for a in frames)


def _end_to_end(frames: list[Atoms], cutoff: float) -> int:
    import collections

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "shard_0000.h5"
        write_shard(path, build_graphs(frames, "bench", cutoff, False, collections.Counter()),
                    cutoff=cutoff)
        return int(GraphStore(path).num_edges.sum())


PEERS: dict[str, Callable[[list[Atoms], float], int]] = {
    "ase.neighbor_list": _ase, "matscipy.neighbour_list": _matscipy,
    "vesin (alone)": _vesin, "cfmtrain end-to-end (HDF5)": _end_to_end,
}


def measure(frames: list[Atoms], cutoff: float, repeats: int, distinct: int) -> list[dict]:
    """Each method's median time over `repeats` paired rounds on the same frames (the first
    `distinct` of which are all the distinct structures): every method once per round, in an
    order shuffled per round (measure.paired), so that a change of machine load affects every
    method of a round alike. `vs_vesin` is the median of the per-round ratios of graphs per
    second to vesin's, with its 10-90% range (`ratio_p10`, `ratio_p90`)."""
    # ASE is ~30x slower: it gets one copy of the distinct structures (the same mixture)
    subsets = {name: frames[:distinct] if name == "ase.neighbor_list" else frames for name in PEERS}
    for name, fn in PEERS.items():
        fn(subsets[name][:5], cutoff)  # warm-up (imports, first allocations)
    edges: dict[str, int] = {}

    def arm(name: str) -> Callable[[], None]:
        def once() -> None:
            edges[name] = PEERS[name](subsets[name], cutoff)
        return once

    rounds = run_rounds({name: arm(name) for name in PEERS}, repeats, seed=0)
    vesin = "vesin (alone)"
    rows = []
    for name in PEERS:
        seconds = float(np.median(rounds.times(name)))
        graphs = len(subsets[name])
        # graphs per second over vesin's, round by round
        ratio = Ratio.of(rounds.times(vesin) / rounds.times(name) * graphs / len(subsets[vesin]))
        rows.append({"method": name, "graphs": graphs, "edges": edges[name], "median_s": seconds,
                     "graphs_per_s": graphs / seconds, "edges_per_s": edges[name] / seconds,
                     "vs_vesin": ratio.median, **ratio.columns()})
    return rows


@dataclasses.dataclass
class GraphsSettings(BenchSettings):
    """The preset and the cutoff."""

    cutoff: float = setting(CUTOFF, "radius-graph cutoff (Å)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain bench graphs`."""
    parser.add_argument("--output", type=Path,
                        help="CSV (default results/bench/graphs_<preset>.csv)")
    add_settings(parser, GraphsSettings)


def run(args: argparse.Namespace) -> int:
    """Generate the `mini` structures in memory, time every method, print and write the table."""
    s = from_args(GraphsSettings, args)
    preset = PRESETS[s.preset]
    distinct = list(iter_mini_frames(scale=preset["scale"], seed=0))
    frames = distinct * preset["copies"]
    rows = measure(frames, s.cutoff, preset["repeats"], len(distinct))
    output = args.output or Path(f"results/bench/graphs_{s.preset}.csv")
    report(rows, output, f"Graph construction, {len(frames)} mini graphs, cutoff {s.cutoff} Å"
           f" (median of {preset['repeats']} paired rounds)")
    return 0
