"""Figure 11's sweep: seconds per training step against graphs per batch, for small and for large
molecules of the data set, in float32 and float64; out-of-memory points recorded as such."""

from __future__ import annotations

import dataclasses

import numpy as np

from cfmtrain.sweep.series import run_series
from cfmtrain.tables import Record


@dataclasses.dataclass(frozen=True)
class BatchPoint(Record):
    """One batch of the sweep: its molecules (small or large, from `subset`), dtype, graphs
    (of them distinct: a small subset is cycled), atoms and edges; the median seconds of its
    training steps and the peak RSS (MB) when `status` is ok, else oom, error (`error` says
    what) or skipped (a smaller batch of its series ran out of memory)."""

    molecules: str
    subset: str
    dtype: str
    graphs: int
    distinct_graphs: int
    atoms: int
    edges: int
    step_s: float
    status: str
    peak_rss_mb: float
    error: str

    TABLE = "batch-size sweep table"
    WRITER = "`cfmtrain sweep batch`"


def pick_graphs(subsets: np.ndarray, names: list[str], subset: str, count: int,
                seed: int) -> list[int]:
    """`count` store indices of `subset`, a seeded shuffle, cycled when the subset is smaller."""
    if subset not in names:
        raise ValueError(f"batch sweep: subset {subset!r} not in the data set (has {names})")
    members = np.flatnonzero(subsets == names.index(subset))
    order = np.random.default_rng(seed).permutation(members)
    return [int(order[k % len(order)]) for k in range(count)]


def batch_sweep(store, split: str, molecules: dict[str, str], sizes: dict[str, list[int]],
                dtypes: list[str], overrides: list[str], repeats: int, budget_mb: int,
                threads: int, seed: int = 0) -> list[BatchPoint]:
    """One subprocess per dtype; in it one group of growing batches per kind of molecule."""
    batches, labels, groups = [], [], []
    for group, (kind, subset) in enumerate(molecules.items()):
        for count in sizes[kind]:
            b = pick_graphs(store.subsets, store.subset_names, subset, count, seed)
            batches.append(b)
            groups.append(group)
            labels.append({"molecules": kind, "subset": subset, "graphs": len(b),
                           "atoms": int(store.num_atoms[b].sum()),
                           "edges": int(store.num_edges[b].sum()), "distinct_graphs": len(set(b))})
    rows = []
    for dtype in dtypes:
        spec = {"graphs": str(store.path), "split": split, "batches": batches, "groups": groups,
                "overrides": [*overrides, f"model.dtype={dtype}"], "repeats": repeats,
                "memory_budget_mb": budget_mb, "threads": threads}
        series = run_series(spec, [{**lab, "dtype": dtype} for lab in labels])
        for row in series:
            print(f"  {row['molecules']:6s} {dtype} {row['graphs']:4d} graphs {row['atoms']:6d} "
                  f"atoms: {row['status']} {row.get('step_s', float('nan')):.3f} s", flush=True)
        rows += series
    return [BatchPoint.of(row) for row in rows]
