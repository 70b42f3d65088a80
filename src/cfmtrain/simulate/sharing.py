"""Ranks that share a node: a rank's compute runs slower while the other ranks of its node
compute too (they share its cores' caches, memory bandwidth, or the physical core of two
hardware threads), and at full speed once they are done.

Measured here: with 2 ranks on this 2-core host, each rank computes 1.4-1.7x slower while the
other computes. A fixed graph count leaves one rank idle for much of a step, which then runs
alone; balanced ranks always compute together. So balancing saves less than the slowest
rank's time alone suggests, and a model that takes each step's slowest rank at its solo speed
predicts the balancer's and the kernels' speed-ups too high (by 20-40% at 2 ranks).

Model: a node's ranks hold solo compute times t_1 <= ... <= t_k (0 for a rank without a
batch); while m of them compute, each advances at 1 / f(m) of its solo speed, with f(1) = 1,
f(k) = `slowdown` and linear between; the node's step ends when its last rank does. Two
factors per compute path are fitted on the measured runs: `scale`, their solo compute over
the calibration's law (single-rank runs), and `slowdown`, from each multi-rank step's rank with
the least work (it computes alongside the others all along).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from cfmtrain.simulate.run_steps import STEP, local_work_s, timed_steps
from cfmtrain.train.runs import Run

if TYPE_CHECKING:
    from cfmtrain.simulate.costmodel import CostModel


def node_step_s(compute: np.ndarray, ranks_per_node: int, slowdown: float) -> np.ndarray:
    """(steps,) seconds of each step's slowest node, from (steps, ranks) solo compute times;
    rank r is on node r // ranks_per_node."""
    steps, ranks = compute.shape
    k = max(1, min(ranks_per_node, ranks))
    nodes = -(-ranks // k)
    padded = np.zeros((steps, nodes * k))
    padded[:, :ranks] = compute
    solo = np.sort(padded.reshape(steps, nodes, k), axis=2)
    if k == 1 or slowdown == 1.0:
        return solo[:, :, -1].max(axis=1)
    previous = np.concatenate([np.zeros((steps, nodes, 1)), solo[:, :, :-1]], axis=2)
    running = k - np.arange(k)  # ranks still computing in each phase (idle ones: no phase)
    factor = 1.0 + (slowdown - 1.0) * (running - 1) / (k - 1)
    return ((solo - previous) * factor).sum(axis=2).max(axis=1)


def _solo_and_measured(law: CostModel, run: Run) -> tuple[pd.DataFrame, int]:
    """The run's timed steps with each rank's solo compute by the law (`solo`) and its measured
    own work (`measured`), and its ranks."""
    steps = timed_steps(run)
    return steps.assign(solo=law.compute_s(steps.atoms.to_numpy(), steps.edges.to_numpy()),
                        measured=local_work_s(steps)), run.ranks


def fit_scale(law: CostModel, runs: list[Run]) -> float:
    """Measured over the law's compute, summed over the single-rank runs' steps (1 if none)."""
    pairs = [_solo_and_measured(law, r) for r in runs if r.ranks == 1]
    solo = sum(float(s.solo.sum()) for s, _ in pairs)
    return sum(float(s.measured.sum()) for s, _ in pairs) / solo if solo > 0 else 1.0


def fit_slowdown(law: CostModel, runs: list[Run], scale: float) -> tuple[float, int]:
    """(slowdown, ranks per node) from the multi-rank runs (each on one node): over their
    steps, the measured own work of the rank with the least solo compute over its scaled solo
    compute; (1, 1) without such runs."""
    measured = solo = 0.0
    ranks = 1
    for run in runs:
        if run.ranks < 2:
            continue
        steps, _ = _solo_and_measured(law, run)
        least = steps.loc[steps.groupby([STEP.epoch, STEP.step]).solo.idxmin()]
        measured += float(least.measured.sum())
        solo += float(least.solo.sum()) * scale
        ranks = max(ranks, run.ranks)
    return (measured / solo, ranks) if solo > 0 else (1.0, 1)


def fit_sharing(law: CostModel, runs: list[Run]) -> dict:
    """The law's `scale`, `shared_slowdown` and `ranks_per_node` fitted on `runs` (of its
    compute path), as CostModel fields."""
    scale = fit_scale(law, runs)
    slowdown, ranks = fit_slowdown(law, runs, scale)
    return {"scale": scale, "shared_slowdown": slowdown, "ranks_per_node": ranks}
