"""The simulator's calibration: seconds per training step of the ablation cells' own model over a
sweep of batch sizes (as Figure 11), for each compute path of the variants (mace-torch's modules
or the fused kernels), on batches of sparse and of dense graphs so that atoms and edges vary apart.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cfmtrain.paper import BASELINE, KERNEL
from cfmtrain.sweep.capacity import fill_bin
from cfmtrain.sweep.series import run_series
from cfmtrain.tables import Record

# One variant per compute path: the step of a variant depends on its kernels only (the balancer
# changes which graphs form a batch, not the cost of a batch); cfmtrain.train.config decides.
PATHS = {"mace": BASELINE.name, "fused": KERNEL.name}
MIN_TIME_S = 3.0  # timed seconds per point at least (small batches: more steps)
MAX_REPEATS = 15


@dataclasses.dataclass(frozen=True)
class CalibrationPoint(Record):
    """One batch timed on one compute path (`kernels`: mace or fused, through `variant`): its
    pool (sparse or dense graphs), the atoms it was filled to, its graphs, atoms and edges;
    when `status` is ok the median, min and max wall seconds of its training steps and the
    median CPU seconds of the training thread over `repeats` steps, else oom, error (`error`
    says what) or skipped. The simulator fits its cost laws on step_cpu_s."""

    kernels: str
    variant: str
    pool: str
    target_atoms: int
    graphs: int
    atoms: int
    edges: int
    step_s: float
    step_min_s: float
    step_max_s: float
    step_cpu_s: float
    repeats: int
    status: str
    error: str

    TABLE = "calibration table"
    WRITER = "`cfmtrain sweep calibrate`"


def calibration_batches(atoms: np.ndarray, edges: np.ndarray, train: np.ndarray,
                        targets: list[int], seed: int = 0) -> tuple[list[list[int]], list[dict]]:
    """Batches of training graphs filled to each target atom count from two pools: the graphs
    with fewer edges per atom than the median (sparse) and the others (dense)."""
    train = np.asarray(train, np.int64)
    if train.size == 0:
        raise ValueError("calibration: the split has no training graphs")
    density = edges[train] / np.maximum(atoms[train], 1)
    median = float(np.median(density))
    pools = {"sparse": train[density < median], "dense": train[density >= median]}
    batches, labels = [], []
    for pool, members in pools.items():
        if members.size == 0:
            continue
        order = np.random.default_rng(seed).permutation(members)
        for target in sorted(targets):
            if atoms[order].min() > target:
                continue  # every graph of the pool is larger than the target
            batch = fill_bin(atoms, order, target)
            batches.append(batch)
            labels.append({"pool": pool, "target_atoms": target, "graphs": len(batch),
                           "atoms": int(atoms[batch].sum()), "edges": int(edges[batch].sum())})
    if len(batches) < 4:
        raise ValueError(f"calibration: only {len(batches)} batches for targets {targets}; need "
                         "at least 4 (more targets, or a data set with graphs that small)")
    return batches, labels


def calibration_sweep(store, split: str, train: np.ndarray, targets: list[int],
                      overrides: list[str], repeats: int, threads: int,
                      seed: int = 0) -> list[CalibrationPoint]:
    """One subprocess per compute path, timing at least `repeats` steps of every batch, more
    (up to MAX_REPEATS) until MIN_TIME_S of steps, with the training settings `overrides` (the
    cells' model and dtype); each point's median, min and max wall time and median CPU time of
    the training thread."""
    batches, labels = calibration_batches(np.asarray(store.num_atoms), np.asarray(store.num_edges),
                                          train, targets, seed)
    rows = []
    for kernels, variant in PATHS.items():
        paths = store.path if isinstance(store.path, tuple) else [store.path]
        spec = {"graphs": [str(p) for p in paths], "split": split, "batches": batches,
                "overrides": [*overrides, f"variant={variant}"], "repeats": repeats,
                "min_time_s": MIN_TIME_S, "max_repeats": MAX_REPEATS, "threads": threads}
        series = run_series(spec, [{**lab, "kernels": kernels, "variant": variant}
                                   for lab in labels])
        for row in series:
            print(f"  {kernels:5s} {row['pool']:6s} {row['atoms']:5d} atoms {row['edges']:6d} "
                  f"edges: {row['status']} {row.get('step_s', float('nan')):.3f} s", flush=True)
        if not any(row["status"] == "ok" for row in series):
            raise RuntimeError(f"calibration of the {kernels} path ({variant}): no batch was "
                               f"timed; first: {series[0]['status']} {series[0].get('error')}")
        rows += series
    return [CalibrationPoint.of(row) for row in rows]
