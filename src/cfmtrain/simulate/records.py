"""The simulator's tables (`cfmtrain simulate`): strong.csv, weak.csv and strategies.csv (one
simulated epoch a row, with the verdict on the variant's fit), validation.csv and fit.csv.
"""

from __future__ import annotations

import dataclasses
import math

from cfmtrain.simulate.costmodel import CostModel
from cfmtrain.tables import Record

WRITER = "`cfmtrain simulate`"


@dataclasses.dataclass(frozen=True)
class EpochRow(Record):
    """One simulated epoch of a run (a variant, or a batching strategy under a variant's cost
    model) at `ranks`: its steps, epoch time with the fit's band, the sums over its steps of
    the slowest rank's data wait + compute and of the all-reduce, the ranks' balance (mean
    over max), the mean atoms per batch and the strong scaling efficiency against the run's
    fewest ranks (seconds for the times)."""

    run: str
    variant: str
    ranks: int
    steps: int
    epoch_s: float
    epoch_s_low: float
    epoch_s_high: float
    slowest_compute_s: float
    allreduce_s: float
    balance: float
    mean_atoms_per_batch: float
    strong_efficiency: float

    TABLE = "simulator table"
    WRITER = WRITER
    OPTIONAL = ("epoch_s_low", "epoch_s_high")  # came later: an older table has no band


@dataclasses.dataclass(frozen=True)
class StrategyRow(EpochRow):
    """strategies.csv: an epoch of a batching strategy, with the case (CPU or accelerator),
    whether its cost model supports the number (if not, why), and the group held out of the
    ratio checks with its error."""

    case: str
    supported: bool
    unsupported_reason: str
    held_out: str
    held_out_error: float

    OPTIONAL = (*EpochRow.OPTIONAL, "held_out", "held_out_error")  # an older table's verdict


@dataclasses.dataclass(frozen=True)
class StrongRow(StrategyRow):
    """strong.csv (and strong_accelerator.csv): a variant's epoch with its batching
    (`strategy`)."""

    strategy: str


@dataclasses.dataclass(frozen=True)
class WeakRow(EpochRow):
    """weak.csv (and weak_accelerator.csv): a variant's epoch on a subset of `graphs` graphs
    (`dataset` names its size), with the case and the verdict as in StrategyRow."""

    dataset: str
    graphs: int
    case: str
    supported: bool
    unsupported_reason: str
    held_out: str
    held_out_error: float

    OPTIONAL = StrategyRow.OPTIONAL


@dataclasses.dataclass(frozen=True)
class ValidationRow(Record):
    """validation.csv: a measured cell (`validated_on`, data set/r<ranks>) predicted by its
    variant's law: per epoch the measured and predicted seconds and their relative error, the
    same for the ranks' own work (the all-reduce left out) and the slowest rank's compute
    against its CPU time, the mean error per step, the cell's compute wall/CPU ratio and
    contention, the error that counts (`validation_error`, and what it is `validated_by`),
    threads, the cells the data wait came from and the law's fit."""

    variant: str
    validated_on: str
    ranks: int
    measured_epoch_s: float
    predicted_epoch_s: float
    epoch_rel_error: float
    measured_work_epoch_s: float
    predicted_work_epoch_s: float
    work_rel_error: float
    step_mean_abs_rel_error: float
    measured_cpu_epoch_s: float
    cpu_rel_error: float
    compute_wall_cpu: float
    contended: bool
    validation_error: float
    validated_by: str
    threads: float
    data_wait_from: str
    fit_r2: float
    fit_mean_rel_error: float

    TABLE = "validation table"
    WRITER = WRITER


@dataclasses.dataclass
class FitRow(CostModel, Record):
    """fit.csv: a variant's cost model (CostModel's fields, the covariance written as JSON and
    the sources space-separated), its compute path and the verdict on it: the worst relative
    error of the ratio checks and the held-out group's, whether the model supports
    extrapolation and if not why."""

    kernels: str = ""
    worst_ratio_error: float = math.nan
    held_out: str = ""
    held_out_error: float = math.nan
    supported: bool = False
    unsupported_reason: str = ""

    TABLE = "fit table"
    WRITER = WRITER
