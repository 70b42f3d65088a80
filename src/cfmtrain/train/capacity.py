"""The balancer's bin capacity for a training run: `auto` matches the fixed-count baseline's
optimiser steps per epoch, so that `balancer` and `both` change the balance of the batches and
not their size (and accuracy per epoch stays comparable).

Graphs larger than the chosen capacity each get a bin of their own (`oversize='own_bin'`), so a
few large structures beside many small ones do not halve the step count; the other ranks of that
step carry small graphs up to its size (`cfmtrain.balance.pack.oversize_steps`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from cfmtrain.balance.pack import pack_plan

MIN_STEPS = 20  # an explicit capacity with fewer steps per epoch warns
MAX_RATIO = 4.0  # ... as does one above this multiple of the baseline's mean batch


@dataclasses.dataclass(frozen=True)
class Capacity:
    """The capacity a run uses, how it was chosen, and the step counts it gives."""

    value: int
    source: str  # "auto" or "config"
    steps: int  # Algorithm 1's optimiser steps per epoch at this capacity
    baseline_steps: int  # the fixed-count baseline's steps per epoch
    baseline_mean: float  # the baseline's mean size (atoms or edges) per batch

    def as_dict(self) -> dict:
        """Plain data for summary.json."""
        return dataclasses.asdict(self)


def balancer_steps(sizes: np.ndarray, capacity: int, num_ranks: int) -> int:
    """Optimiser steps per epoch of Algorithm 1 at `capacity` (oversize graphs alone)."""
    return pack_plan(sizes, capacity, num_ranks, oversize="own_bin").num_steps


def baseline_steps(num_graphs: int, graphs_per_batch: int, num_ranks: int) -> int:
    """Steps per epoch of the fixed-count baseline (the last step may be short)."""
    return max(1, math.ceil(num_graphs / (graphs_per_batch * num_ranks)))


def auto_capacity(sizes: np.ndarray, graphs_per_batch: int, num_ranks: int) -> Capacity:
    """The capacity whose Algorithm 1 plan comes nearest the fixed-count baseline's steps per
    epoch: bisection on the real packer (the step count falls with capacity, by jumps) finds the
    smallest capacity with no more steps than the baseline; of it and the capacity below it (more
    steps), the one nearer the baseline's count wins, a tie going to more steps. So a jump from
    32 steps to 28 round a baseline of 31 gives 32, not 28."""
    sizes = np.asarray(sizes, np.int64)
    target = baseline_steps(len(sizes), graphs_per_batch, num_ranks)
    mean = float(sizes.mean()) * graphs_per_batch if len(sizes) else 1.0
    low, high = 1, max(1, int(sizes.sum()))
    while low < high:  # invariant: steps(high) <= target
        mid = (low + high) // 2
        if balancer_steps(sizes, mid, num_ranks) <= target:
            high = mid
        else:
            low = mid + 1
    value, steps = high, balancer_steps(sizes, high, num_ranks)
    if high > 1:
        below = balancer_steps(sizes, high - 1, num_ranks)
        if below - target <= target - steps:
            value, steps = high - 1, below
    return Capacity(value=value, source="auto", steps=steps, baseline_steps=target,
                    baseline_mean=mean)


def resolve_capacity(setting: int | str, sizes: np.ndarray, graphs_per_batch: int,
                     num_ranks: int, size_unit: str = "atoms") -> tuple[Capacity, str | None]:
    """The run's capacity from the config value (`auto` or a number), and a warning (or None)
    when an explicit capacity gives too few steps or batches far above the baseline's."""
    if setting == "auto":
        return auto_capacity(sizes, graphs_per_batch, num_ranks), None
    sizes = np.asarray(sizes, np.int64)
    value = int(setting)
    mean = float(sizes.mean()) * graphs_per_batch if len(sizes) else 1.0
    capacity = Capacity(value=value, source="config",
                        steps=balancer_steps(sizes, value, num_ranks),
                        baseline_steps=baseline_steps(len(sizes), graphs_per_batch, num_ranks),
                        baseline_mean=mean)
    if capacity.steps < MIN_STEPS or value > MAX_RATIO * mean:
        return capacity, (
            f"batch.capacity {value} gives {capacity.steps} optimiser steps per epoch (the "
            f"fixed-count baseline takes {capacity.baseline_steps}, with {mean:.0f} {size_unit} "
            f"per batch on average): fewer steps per epoch usually cost accuracy per epoch; "
            f"set train.settings.batch.capacity: auto (or --set batch.capacity=auto) to match "
            f"the baseline's steps")
    return capacity, None
