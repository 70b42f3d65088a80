"""Figure 11's sweep: seconds per training step against graphs per batch, for small and for large
molecules of the data set, in float32 and float64; out-of-memory points recorded as such."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cfmtrain.sweep.series import run_series


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
                threads: int, seed: int = 0) -> pd.DataFrame:
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
    columns = ["molecules", "subset", "dtype", "graphs", "distinct_graphs", "atoms", "edges",
               "step_s", "status", "peak_rss_mb", "error"]
    return pd.DataFrame(rows).reindex(columns=columns)
