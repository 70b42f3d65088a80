"""What the simulator reads of a measured run's steps: its timed steps (the warm-up left out),
each rank's own work in a step, and the mean data wait."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cfmtrain.train.runs import Run
from cfmtrain.train.steps import StepRecord

STEP = StepRecord.col
LOCAL_WORK = (STEP.compute_s, STEP.optim_s)  # a rank's own work in a step: forward+backward,
                                             # optimiser


def local_work_s(steps: pd.DataFrame) -> np.ndarray:
    """Seconds of each (step, rank) row's own work: compute plus optimiser step."""
    return steps[list(LOCAL_WORK)].sum(axis=1, min_count=len(LOCAL_WORK)).to_numpy(np.float64)


def timed_steps(run: Run) -> pd.DataFrame:
    """The run's step log without its warm-up: the first epoch when it has several (as the
    summary's epoch time), else the first step (allocation, caches)."""
    steps = run.steps()
    if steps.epoch.nunique() > 1:
        return steps[steps.epoch > steps.epoch.min()]
    return steps[steps.step > steps.step.min()] if len(steps) > 1 else steps


def data_wait_s(runs: list[Run]) -> float:
    """Mean seconds a step waited for its batch over the timed steps of `runs`."""
    return float(pd.concat([timed_steps(r).data_s for r in runs]).mean())
