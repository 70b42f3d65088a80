"""Per-epoch time of a schedule: the sum over steps of the slowest node's step time (its ranks
sharing it as the measured runs did: sharing.py) plus one gradient all-reduce per step (no
overlap of communication with backward: an upper bound), with the band the cost model's
uncertainty gives it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from cfmtrain.simulate.allreduce import Network
from cfmtrain.simulate.costmodel import CostModel
from cfmtrain.simulate.schedule import Schedule
from cfmtrain.simulate.sharing import node_step_s
from cfmtrain.simulate.sizes import Sizes


@dataclasses.dataclass
class EpochEstimate:
    """One simulated epoch, split into its parts (seconds)."""

    ranks: int
    steps: int
    epoch_s: float
    slowest_compute_s: float  # sum over steps of the slowest rank's data wait + compute
    allreduce_s: float  # sum over steps of the all-reduce
    mean_compute_s: float  # sum over steps of the mean rank's data wait + compute
    mean_atoms_per_batch: float
    epoch_s_low: float  # the band of epoch_s from the cost model's uncertainty (CostModel.band)
    epoch_s_high: float

    @property
    def balance(self) -> float:
        """Mean over ranks / max over ranks of the step time, summed over the epoch (1 = even)."""
        return self.mean_compute_s / self.slowest_compute_s if self.slowest_compute_s else 1.0


def rank_step_times(schedule: Schedule, model: CostModel) -> np.ndarray:
    """(steps, ranks) seconds of each rank's data wait + compute; idle ranks take 0."""
    times = model.step_s(schedule.atoms, schedule.edges)
    return np.where(schedule.graphs > 0, times, 0.0)


def simulate_epoch(schedule: Schedule, model: CostModel, network: Network,
                   gradient_bytes: float) -> EpochEstimate:
    """Sum over steps of (the data wait + the slowest node's compute) + an all-reduce of the
    gradients; the band from the design rows of each step's slowest rank (the epoch is linear
    in the coefficients once the slowest rank of each step is fixed)."""
    times = rank_step_times(schedule, model)
    slowest_rank = times.argmax(axis=1)
    compute = np.where(schedule.graphs > 0, model.compute_s(schedule.atoms, schedule.edges), 0.0)
    slowest = model.data_wait_s + node_step_s(compute, model.ranks_per_node,
                                              model.shared_slowdown)
    reduce_s = network.allreduce_s(schedule.ranks, gradient_bytes)
    busy = schedule.graphs > 0
    pick = (np.arange(schedule.steps), slowest_rank)
    features = model.features(schedule.atoms[pick], schedule.edges[pick]).sum(axis=0)
    epoch_s = float(slowest.sum() + reduce_s * schedule.steps)
    low, high = model.band(epoch_s, features)
    return EpochEstimate(
        ranks=schedule.ranks, steps=schedule.steps, epoch_s=epoch_s,
        slowest_compute_s=float(slowest.sum()), allreduce_s=float(reduce_s * schedule.steps),
        mean_compute_s=float(times.mean(axis=1).sum()),
        mean_atoms_per_batch=float(schedule.atoms[busy].mean()) if busy.any() else 0.0,
        epoch_s_low=low, epoch_s_high=high)


ScheduleFn = Callable[[Sizes, int], Schedule]


def scaling_table(sizes: Sizes, runs: dict[str, tuple[ScheduleFn, CostModel]],
                  ranks: Iterable[int], network: Network, gradient_bytes: float) -> pd.DataFrame:
    """One row per (run, ranks): simulated epoch time, its parts, speedup and efficiency.

    `runs` maps a label (a variant, or a strategy under a variant's cost model) to the function
    that schedules the graphs on R ranks and the cost model of its steps. Schedules are shared
    between runs that use the same function.
    """
    cache: dict[tuple[int, int], Schedule] = {}
    rows = []
    for label, (schedule_fn, model) in runs.items():
        for r in ranks:
            key = (id(schedule_fn), r)
            if key not in cache:
                cache[key] = schedule_fn(sizes, r)
            est = simulate_epoch(cache[key], model, network, gradient_bytes)
            rows.append({"run": label, "variant": model.variant, "ranks": r, "steps": est.steps,
                         "epoch_s": est.epoch_s, "epoch_s_low": est.epoch_s_low,
                         "epoch_s_high": est.epoch_s_high,
                         "slowest_compute_s": est.slowest_compute_s,
                         "allreduce_s": est.allreduce_s, "balance": est.balance,
                         "mean_atoms_per_batch": est.mean_atoms_per_batch})
    table = pd.DataFrame(rows)
    first = table.groupby("run")["ranks"].transform("min")
    base = table[table.ranks == first].set_index("run")
    ref_time = table.run.map(base.epoch_s)
    ref_ranks = table.run.map(base.ranks)
    table["strong_efficiency"] = ref_time * ref_ranks / (table.epoch_s * table.ranks)
    return table
