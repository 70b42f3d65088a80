"""Packing quality of a plan: bins against the lower bound, fill, padding, step balance, and the
fraction of batches repeated between two epochs.
"""

from __future__ import annotations

import numpy as np

from cfmtrain.balance.plan import Plan


def lower_bound_bins(sizes: np.ndarray, capacity: float, num_ranks: int) -> int:
    """ceil(sum / C) rounded up to a multiple of R: no plan within capacity has fewer bins."""
    total = sizes.sum()
    lower = -(-int(total) // int(capacity)) if sizes.dtype.kind in "iu" and float(
        capacity).is_integer() else int(np.ceil(total / capacity))
    return -(-lower // num_ranks) * num_ranks


def step_balance(loads: np.ndarray, num_ranks: int) -> float:
    """Mean over steps of (mean load / max load) among the R bins of the step (1 = perfect)."""
    steps = np.asarray(loads, np.float64).reshape(-1, num_ranks)
    if not len(steps):
        return 1.0
    top = steps.max(axis=1)
    ratio = np.divide(steps.mean(axis=1), top, out=np.ones(len(steps)), where=top > 0)
    return float(ratio.mean())


def epoch_cost(loads: np.ndarray, num_ranks: int, total: float) -> float:
    """Sum over steps of the step's largest load, times R, over the total size: the epoch time
    relative to a perfect split when time is proportional to size (1 = ideal)."""
    steps = np.asarray(loads, np.float64).reshape(-1, num_ranks)
    return float(steps.max(axis=1).sum() * num_ranks / total) if total > 0 else 1.0


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a well-mixed 64-bit hash of each index (wrapping arithmetic)."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def batch_keys(plan: Plan) -> np.ndarray:
    """An order-independent 64-bit key per non-empty bin: equal sets of graphs, equal keys."""
    cumulative = np.concatenate([[np.uint64(0)], np.cumsum(_mix64(plan.flat), dtype=np.uint64)])
    keys = cumulative[plan.offsets[1:]] - cumulative[plan.offsets[:-1]]
    keys = keys ^ _mix64(plan.counts + np.int64(1 << 40))
    return keys[plan.counts > 0]


def repeated_fraction(previous: Plan, current: Plan) -> float:
    """Fraction of `current`'s non-empty batches (as sets of graphs) that `previous` also had."""
    now = batch_keys(current)
    return float(np.isin(now, batch_keys(previous)).mean()) if len(now) else 0.0


def plan_metrics(plan: Plan, sizes: np.ndarray, capacity: float) -> dict:
    """Quality of the plan as run (empty bins padded the DistributedSampler way)."""
    run, padded_bins = plan.padded()
    loads = run.loads(sizes).astype(np.float64)
    weights = run.weights(len(sizes))
    return {
        "bins": len(run),
        "steps": run.num_steps,
        "lower_bound": lower_bound_bins(sizes, capacity, run.num_ranks),
        "mean_fill": float(loads.mean() / capacity) if len(loads) else 0.0,
        "padding": float(np.maximum(capacity - loads, 0).mean() / capacity) if len(loads) else 0.0,
        "over_capacity": float((loads > capacity).mean()) if len(loads) else 0.0,
        "max_load": float(loads.max()) if len(loads) else 0.0,
        "step_balance": step_balance(loads, run.num_ranks),
        "epoch_cost": epoch_cost(loads, run.num_ranks, float(np.sum(sizes))),
        "copies": int((weights == 0).sum()),
        "padded_bins": padded_bins,
    }
