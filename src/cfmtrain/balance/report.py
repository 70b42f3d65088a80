"""`cfmtrain balance`: the packing-quality table (CSV, Markdown) of every strategy for a data
set (its Figure 12 is `cfmtrain figure fig12_graphs_per_rank`). Reads only the graph store's
per-graph size table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from cfmtrain.atomic import atomic_path
from cfmtrain.balance.costs import MEASURES, graph_costs
from cfmtrain.balance.metrics import plan_metrics, repeated_fraction
from cfmtrain.balance.strategies import STRATEGIES
from cfmtrain.paper import CAPACITY

# (row label, strategy, seeded, options): the paper's deterministic Algorithm 1 alone; with our
# refinements (kernels/balance/refine.h, rebalance.h: they act only where Algorithm 1 misses the
# bins or balance goal); refined and randomised per epoch; the peers with their default shuffling.
VARIANTS = [("algorithm1", "algorithm1", False, {"refine": False}),
            ("algorithm1+refine", "algorithm1", False, {}),
            ("algorithm1+refine+random", "algorithm1", True, {}),
            *[(name, name, True, {}) for name in STRATEGIES if name != "algorithm1"]]
ROW_NOTE = ("algorithm1: the paper's Algorithm 1 alone (our reading of its pseudocode). "
            "algorithm1+refine: ours, Algorithm 1 then two refinements that act only where it "
            "misses a goal: above lower bound + R bins its leftovers are refilled into the gaps "
            "of its first round; below a step balance of 0.999 the uneven steps are dealt again "
            "by LPT within the capacity. +random: ties, step order and ranks drawn from "
            "(seed, epoch).")


def packing_table(sizes: np.ndarray, capacity: float, ranks: list[int], seed: int = 0,
                  oversize: str = "error") -> pd.DataFrame:
    """One row per (rank count, strategy): plan metrics of epoch 0 and batches repeated in 1."""
    rows = []
    for num_ranks in ranks:
        for label, name, seeded, extra in VARIANTS:
            options = {"oversize": oversize} if "oversize" in _parameters(name) else {}
            run = dict(seed=seed if seeded else None, **options, **extra)
            plan = STRATEGIES[name](sizes, capacity, num_ranks, epoch=0, **run)
            following = STRATEGIES[name](sizes, capacity, num_ranks, epoch=1, **run)
            metrics = plan_metrics(plan, sizes, capacity)
            rows.append({"ranks": num_ranks, "strategy": label, **metrics,
                         "excess_bins": metrics["bins"] - metrics["lower_bound"],
                         "repeated": repeated_fraction(plan, following)})
    return pd.DataFrame(rows)


def _parameters(name: str) -> tuple[str, ...]:
    code = STRATEGIES[name].__code__
    return code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]


def markdown(table: pd.DataFrame, title: str) -> str:
    """The table as GitHub Markdown."""
    lines = [f"### {title}", "",
             "| R | strategy | bins | lower bound | mean fill | padding | step balance | "
             "epoch cost | max load | repeated | copies |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table.itertuples():
        lines.append(f"| {r.ranks} | {r.strategy} | {r.bins:,} | {r.lower_bound:,} | "
                     f"{r.mean_fill:.4f} | {r.padding:.4f} | {r.step_balance:.5f} | "
                     f"{r.epoch_cost:.4f} | {r.max_load:g} | {r.repeated:.3f} | {r.copies} |")
    lines += ["", ROW_NOTE, "",
              "Step balance: mean over steps of mean/max load among the R bins of a step. "
              "Epoch cost: sum over steps of the largest load, times R, over the total size "
              "(1 = a perfect split). Repeated: share of epoch 1's batches already in epoch 0. "
              "Copies: padding repeats (weight 0)."]
    return "\n".join(lines) + "\n"


def write_report(sizes: np.ndarray, *, capacity: float, ranks: list[int], seed: int, unit: str,
                 dataset: str, csv: Path, markdown_path: Path, oversize: str = "error") -> None:
    """The table (CSV, Markdown) for one size array."""
    table = packing_table(sizes, capacity, ranks, seed, oversize)
    with atomic_path(csv) as tmp:
        table.to_csv(tmp, index=False)
    title = f"Packing quality, {dataset}: {len(sizes):,} graphs, capacity {capacity:g} {unit}"
    with atomic_path(markdown_path) as tmp:
        tmp.write_text(markdown(table, title))
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Graph store, size measure, capacity, rank counts, outputs."""
    parser.add_argument("--graphs", type=Path, nargs="+", required=True,
                        help="graph store: shard .h5 files or folders (several = their union)")
    parser.add_argument("--name", default=None, help="data set name for titles")
    parser.add_argument("--capacity", type=float, default=CAPACITY,
                        help="bin capacity (size units)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64], help="rank counts")
    parser.add_argument("--measure", choices=MEASURES, default="atoms", help="graph size")
    parser.add_argument("--a", type=float, default=1.0, help="linear cost: per atom")
    parser.add_argument("--b", type=float, default=0.0, help="linear cost: per edge")
    parser.add_argument("--seed", type=int, default=0, help="shuffling seed")
    parser.add_argument("--oversize", choices=["error", "own_bin"], default="error",
                        help="graphs above the capacity: fail, or a bin of their own")
    parser.add_argument("--csv", type=Path, required=True)
    parser.add_argument("--markdown", type=Path, required=True)


def run(args: argparse.Namespace) -> int:
    """Read the store's size table, write the table."""
    from cfmtrain.graphs.store import GraphStore  # lazy: h5py, torch; light command

    store = GraphStore(args.graphs if len(args.graphs) > 1 else args.graphs[0],
                       check_edges=False)  # the table alone
    sizes = graph_costs(store.num_atoms, store.num_edges, args.measure, args.a, args.b)
    unit = {"atoms": "atoms", "edges": "edges"}.get(args.measure,
                                                     f"cost {args.a:g}·atoms + {args.b:g}·edges")
    write_report(sizes, capacity=args.capacity, ranks=args.ranks, seed=args.seed, unit=unit,
                 dataset=args.name or args.graphs[0].name, csv=args.csv,
                 markdown_path=args.markdown, oversize=args.oversize)
    return 0
