"""Section 5.5's sweep: training throughput against bin capacity (atoms per batch), and the
recommended capacity for the machine at hand: at least the largest graph, at most what fits in
memory, and the smallest capacity whose throughput is within `tolerance` of the best measured."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from cfmtrain.sweep.series import run_series
from cfmtrain.tables import Record


@dataclasses.dataclass(frozen=True)
class CapacityPoint(Record):
    """One bin of the sweep: the dtype, the capacity (atoms) it was filled to, its graphs,
    atoms and edges; when `status` is ok the median seconds of its training steps, the
    throughput (atoms per second) and the peak RSS (MB), else oom, error (`error` says what) or
    skipped."""

    dtype: str
    capacity: int
    graphs: int
    atoms: int
    edges: int
    step_s: float
    atoms_per_s: float
    status: str
    peak_rss_mb: float
    error: str

    TABLE = "capacity sweep table"
    WRITER = "`cfmtrain sweep capacity`"


def fill_bin(atoms: np.ndarray, candidates: np.ndarray, capacity: int) -> list[int]:
    """Graphs from `candidates` in order that fit a bin of `capacity` atoms (first fit)."""
    chosen, load = [], 0
    for g in candidates:
        if load + atoms[g] <= capacity:
            chosen.append(int(g))
            load += int(atoms[g])
            if load == capacity:
                break
    if not chosen:
        raise ValueError(f"capacity {capacity}: smaller than every graph of the data set")
    return chosen


def capacity_sweep(store, split: str, train: np.ndarray, capacities: list[int],
                   dtypes: list[str], overrides: list[str], repeats: int, budget_mb: int,
                   threads: int, seed: int = 0) -> list[CapacityPoint]:
    """One series per dtype; each point a bin of training graphs filled to the capacity."""
    candidates = np.random.default_rng(seed).permutation(train)
    batches = [fill_bin(store.num_atoms, candidates, c) for c in sorted(capacities)]
    labels = [{"capacity": c, "graphs": len(b), "atoms": int(store.num_atoms[b].sum()),
               "edges": int(store.num_edges[b].sum())} for c, b in zip(sorted(capacities),
                                                                       batches, strict=True)]
    rows = []
    for dtype in dtypes:
        spec = {"graphs": str(store.path), "split": split, "batches": batches,
                "overrides": [*overrides, f"model.dtype={dtype}"], "repeats": repeats,
                "memory_budget_mb": budget_mb, "threads": threads}
        rows += run_series(spec, [{**lab, "dtype": dtype} for lab in labels])
    return [CapacityPoint.of({**row, "atoms_per_s": row["atoms"] / row.get("step_s", math.nan)})
            for row in rows]


def recommend(frame: pd.DataFrame, largest_graph: int, dtype: str,
              tolerance: float = 0.1) -> dict:
    """The recommended capacity for `dtype` from the sweep, with the bounds it respects."""
    rows = frame[frame.dtype == dtype].sort_values("capacity")
    ok = rows[(rows.status == "ok") & (rows.capacity >= largest_graph)]
    failed = rows[rows.status == "oom"]
    upper = int(failed.capacity.min()) - 1 if not failed.empty else None
    if ok.empty:
        return {"dtype": dtype, "recommended_capacity": None, "lower_bound": largest_graph,
                "memory_upper_bound": upper,
                "reason": "no capacity at or above the largest graph ran within memory"}
    best = float(ok.atoms_per_s.max())
    saturated = ok[ok.atoms_per_s >= (1 - tolerance) * best]
    choice = int(saturated.capacity.min())
    return {"dtype": dtype, "recommended_capacity": choice, "lower_bound": largest_graph,
            "memory_upper_bound": upper, "best_atoms_per_s": best,
            "reason": f"smallest capacity >= the largest graph ({largest_graph} atoms) within "
                      f"{100 * tolerance:.0f}% of the best throughput ({best:.0f} atoms/s)"
                      + (f"; capacities >= {upper + 1} ran out of memory" if upper else "")}
