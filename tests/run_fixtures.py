"""Writes small training-run folders in the format `cfmtrain train` writes (summary.json,
steps.csv, epochs.csv), with step times from a known linear cost, for the simulator and figure
tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

STEP_FIELDS = ("epoch", "step", "rank", "graphs", "atoms", "edges", "data_s", "compute_s",
               "wait_s", "allreduce_s", "optim_s", "step_s", "loss")


def write_run(root: Path, dataset: str, variant: str, ranks: int, *, cost=(0.05, 2e-3, 1e-4),
              epochs: int = 3, steps_per_epoch: int = 6, noise: float = 0.0, seed: int = 0,
              allreduce_s: float = 0.01, data_s: float = 0.002, optim_s: float = 0.0,
              balanced: bool = False) -> Path:
    """A run folder results/train/<dataset>/<variant>/r<ranks> under root; returns the folder."""
    rng = np.random.default_rng(seed)
    folder = root / "results" / "train" / dataset / variant / f"r{ranks}"
    folder.mkdir(parents=True, exist_ok=True)
    rows, epoch_rows, step = [], [], 0
    for epoch in range(epochs):
        wall = 0.0
        for _ in range(steps_per_epoch):
            graphs = np.full(ranks, 8)
            atoms = (np.full(ranks, 600) + rng.integers(-20, 20, ranks) if balanced
                     else rng.integers(50, 1200, ranks))
            edges = np.rint(atoms * rng.uniform(20, 40, ranks)).astype(np.int64)
            work = cost[0] + cost[1] * atoms + cost[2] * edges
            work = work * (1 + noise * rng.standard_normal(ranks))
            compute = work - optim_s
            own = data_s + work
            wait = own.max() - own
            for r in range(ranks):
                rows.append({"epoch": epoch, "step": step, "rank": r, "graphs": graphs[r],
                             "atoms": atoms[r], "edges": int(edges[r]), "data_s": data_s,
                             "compute_s": compute[r], "wait_s": wait[r] if ranks > 1 else 0.0,
                             "allreduce_s": allreduce_s if ranks > 1 else 0.0,
                             "optim_s": optim_s,
                             "step_s": own.max() + (allreduce_s if ranks > 1 else 0.0),
                             "loss": 10.0 / (1 + step)})
            wall += own.max() + (allreduce_s if ranks > 1 else 0.0)
            step += 1
        epoch_rows.append({"epoch": epoch, "wall_s": wall, "train_loss": 5.0 / (1 + epoch),
                           "valid_loss": 6.0 / (1 + epoch)})
    pd.DataFrame(rows, columns=STEP_FIELDS).to_csv(folder / "steps.csv", index=False)
    pd.DataFrame(epoch_rows).to_csv(folder / "epochs.csv", index=False)
    times = [e["wall_s"] for e in epoch_rows]
    summary = {"variant": variant, "ranks": ranks, "epochs": epochs,
               "epoch_time_s": float(np.mean(times[1:] if len(times) > 1 else times)),
               "final_train_loss": epoch_rows[-1]["train_loss"],
               "provenance": {"threads": 1, "dtype": "float32"}}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def write_store(path: Path, graphs_per_subset: int = 3, seed: int = 0) -> Path:
    """A small graph store (one shard) with a few graphs in each of mini's subsets. Positions
    and labels are placeholders: only the per-graph size table matters to its users."""
    from cfmtrain.graphs.store import write_shard
    from cfmtrain.sources.mini import SUBSETS

    rng = np.random.default_rng(seed)
    graphs = []
    for name in SUBSETS:
        for k in range(graphs_per_subset):
            n = int(rng.integers(1, 40))
            e = int(n * rng.uniform(5, 40))
            graphs.append({"positions": rng.normal(size=(n, 3)), "numbers": np.full(n, 29),
                           "forces": np.zeros((n, 3)), "unit_shifts": np.zeros((e, 3), int),
                           "edge_index": rng.integers(0, n, (2, e)), "cell": np.eye(3) * 10,
                           "pbc": np.array([True] * 3), "energy": -1.0 * n, "subset": name,
                           "source_index": k})
    path.mkdir(parents=True, exist_ok=True)
    write_shard(path / "shard_0000.h5", graphs, cutoff=4.5)
    return path
