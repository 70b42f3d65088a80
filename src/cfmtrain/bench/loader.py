"""`cfmtrain bench loader`: graphs/s of batch assembly on one core, every method on the same
graphs and the same batches (a seeded shuffle, a fixed graph count per batch):

- cfmtrain's loader: batches assembled whole from the store's arrays, held in memory (the
  default when they fit) or read from the HDF5 shards per batch;
- mace-torch's own in-memory path: its torch_geometric DataLoader collating pre-built AtomicData
  (neighbour lists already computed, as `mace_run_train` holds them);
- cfmtrain's former per-graph path: GraphDataset items read one by one and collated by
  mace-torch's Collater (full preset only: it takes half the quick preset's time in `all`).

Every cfmtrain batch is compared with mace-torch's batch of the same graphs before the timing.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

import numpy as np

from cfmtrain.batches.batching import BatchAssembler
from cfmtrain.batches.data import GraphDataset
from cfmtrain.batches.store_arrays import StoreArrays
from cfmtrain.bench.settings import BenchSettings
from cfmtrain.bench.table import report
from cfmtrain.graphs.build import build_graphs
from cfmtrain.graphs.store import GraphStore, write_shard
from cfmtrain.measure.paired import Ratio, run_rounds
from cfmtrain.paper import CAPACITY, CUTOFF
from cfmtrain.settings import add_settings, from_args, setting
from cfmtrain.sources.mini import iter_mini_frames
from cfmtrain.train.model import store_elements

PRESETS = {"quick": {"scale": 0.1, "repeats": 5, "former": False},
           "full": {"scale": 1.0, "repeats": 5, "former": True}}
MINI_GRAPHS = Path("results/graphs/mini")
OURS, MACE = "cfmtrain (arrays in memory)", "mace-torch DataLoader (pre-built AtomicData)"
GOAL = 10.0  # the goal: ours >= 10x mace-torch's in-memory path on one core


def batch_differences(ours, reference) -> list[str]:
    """The fields in which two mace-torch batches differ (keys, dtype, shape or any value)."""
    if sorted(ours.keys) != sorted(reference.keys):
        return [f"keys {sorted(set(ours.keys) ^ set(reference.keys))}"]
    bad = [k for k in reference.keys if ours[k].dtype != reference[k].dtype
           or ours[k].shape != reference[k].shape or not bool((ours[k] == reference[k]).all())]
    return bad + (["num_graphs"] if ours.num_graphs != reference.num_graphs else [])


def make_batches(num_graphs: int, graphs_per_batch: int, seed: int) -> list[list[int]]:
    """Every graph once in a seeded order, cut into batches of `graphs_per_batch`."""
    order = np.random.default_rng(seed).permutation(num_graphs).tolist()
    return [order[i:i + graphs_per_batch] for i in range(0, num_graphs, graphs_per_batch)]


def methods(dataset, batches: list[list[int]], former: bool = True
            ) -> dict[str, Callable[[], Iterable]]:
    """Each method as a function returning an iterable over all `batches` (with `former`, also
    cfmtrain's former per-graph path)."""
    import torch
    from mace.tools.torch_geometric.dataloader import Collater, DataLoader

    memory = BatchAssembler(dataset, StoreArrays(dataset.store, budget=2**62))
    disk = BatchAssembler(dataset, StoreArrays(dataset.store, budget=0))
    built = [dataset[i] for i in range(len(dataset))]  # as mace_run_train holds its data
    runs = {
        OURS: lambda: map(memory, batches),
        "cfmtrain (HDF5 read per batch)": lambda: map(disk, batches),
        MACE: lambda: DataLoader(built, batch_sampler=batches),
    }
    if former:
        runs["cfmtrain per-graph (GraphDataset + Collater), before"] = \
            lambda: torch.utils.data.DataLoader(dataset, batch_sampler=batches,
                                                collate_fn=Collater([None], [None]))
    return runs


def measure(dataset, graphs_per_batch: int, repeats: int, seed: int = 0,
            former: bool = True) -> list[dict]:
    """One row per method: graphs/s over `repeats` passes (median, min, max), the methods run
    in paired rounds (cfmtrain.measure.paired: each once per round, shuffled); `vs_mace` is
    the median of the per-round speed-ups against mace-torch's DataLoader, with its range."""
    batches = make_batches(len(dataset), graphs_per_batch, seed)
    runs = methods(dataset, batches, former)
    reference = list(runs[MACE]())
    identical = {name: all(not batch_differences(a, b) for a, b in
                           zip(fn(), reference, strict=True)) for name, fn in runs.items()}

    def consume(fn: Callable[[], Iterable]) -> Callable[[], None]:
        def run() -> None:
            collections.deque(fn(), maxlen=0)
        return run

    rounds = run_rounds({name: consume(fn) for name, fn in runs.items()}, repeats, seed)
    n = len(dataset)
    rows = []
    for name in runs:
        t = rounds.times(name)
        ratio = rounds.ratio(MACE, name) if name != MACE else Ratio.of(np.ones(repeats))
        rows.append({"method": name, "graphs": n, "batches": len(batches),
                     "graphs_per_batch": graphs_per_batch, "atoms": int(dataset.num_atoms.sum()),
                     "edges": int(dataset.num_edges.sum()), "repeats": repeats,
                     "median_s": float(np.median(t)), "graphs_per_s": n / float(np.median(t)),
                     "graphs_per_s_min": n / max(t), "graphs_per_s_max": n / min(t),
                     "identical_to_mace": identical[name], "vs_mace": ratio.median,
                     **ratio.columns()})
    return rows


def open_dataset(store_path: Path | list[Path], dtype: str = "float32"):
    """All graphs of the store as a GraphDataset for a model of the store's elements."""
    import torch
    from mace.tools import AtomicNumberTable

    store = GraphStore(store_path)
    everything = np.arange(len(store))
    z_table = AtomicNumberTable(store_elements(store, everything).tolist())
    return GraphDataset(store, everything, z_table, store.cutoff,
                        getattr(torch, dtype), use_stress=True)


def build_mini_store(folder: Path, scale: float, cutoff: float) -> Path:
    """A one-shard store of the generated `mini` structures at `scale`."""
    frames = list(iter_mini_frames(scale=scale, seed=0))
    write_shard(folder / "shard_0000.h5",
                build_graphs(frames, "mini", cutoff, False, collections.Counter()), cutoff=cutoff)
    return folder


@dataclasses.dataclass
class LoaderSettings(BenchSettings):
    """The preset (quick: mini at scale 0.1 when no store is given; full: scale 1), the batches
    and the passes."""

    graphs_per_batch: list[int] = setting([8, 32], "graphs per batch, one table block each "
                                          f"(training's default 8; the paper's {CAPACITY}-atom "
                                          "bins hold about 27 mini graphs)")
    repeats: int | None = setting(None, "passes (null: the preset's)")
    dtype: Literal["float32", "float64"] = setting("float32", "floating-point type of the batches")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain bench loader`: its store and output, then its settings."""
    parser.add_argument("--graphs", type=Path, nargs="+",
                        help=f"graph store: a shard folder, or several (a union; default "
                             f"{MINI_GRAPHS} if built, else the generated mini structures at "
                             f"the preset's scale)")
    parser.add_argument("--output", type=Path,
                        help="CSV (default results/bench/loader_<preset>.csv)")
    add_settings(parser, LoaderSettings)


def run(args: argparse.Namespace) -> int:
    """Time every method on one core, print the table and the goal, write the CSV."""
    import torch

    torch.set_num_threads(1)
    s = from_args(LoaderSettings, args)
    preset = PRESETS[s.preset]
    repeats = s.repeats or preset["repeats"]
    with tempfile.TemporaryDirectory() as tmp:
        store = args.graphs or ([MINI_GRAPHS] if MINI_GRAPHS.is_dir() else None)
        source = " + ".join(map(str, store)) if store else \
            f"mini structures at scale {preset['scale']}"
        store = store or [build_mini_store(Path(tmp), preset["scale"], CUTOFF)]
        dataset = open_dataset(store, s.dtype)
        rows = [{**row, "source": source} for size in s.graphs_per_batch
                for row in measure(dataset, size, repeats, former=preset["former"])]
    output = args.output or Path(f"results/bench/loader_{s.preset}.csv")
    frame = report(rows, output, f"Batch assembly on one core, {len(dataset)} graphs of {source},"
                                 f" {s.dtype} (graphs/s: median of {repeats} paired rounds)")
    for r in frame[frame.method == OURS].itertuples():
        print(f"goal: {r.graphs_per_batch} graphs/batch: ours {r.vs_mace:.1f}x mace-torch's "
              f"in-memory DataLoader (goal >= {GOAL:g}x), identical batches: "
              f"{bool(frame.identical_to_mace.all())}")
    return 0
