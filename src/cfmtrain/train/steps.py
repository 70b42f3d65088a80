"""The step record, declared once: one rank's step, one row of steps.csv, its columns in the
order of StepRecord's fields. The training loop fills it by name; every reader of steps.csv
takes the column names from here (no torch: the simulator and the figures import it).
"""

from __future__ import annotations

import dataclasses

from cfmtrain.tables import Record


@dataclasses.dataclass(frozen=True)
class StepRecord(Record):
    """One rank's step (seconds for the times; train.metrics.StepTimes measures them).

    wait_s: the straggler wait (end of local backward until every rank is there); allreduce_s:
    the gradient all-reduce itself; both NaN outside measurement mode. loss: this rank's share
    of the step's loss (its loss over the world size). cpu_s, compute_cpu_s: the training
    thread's CPU time over the whole step and over its compute (ranks.contention).
    """

    epoch: int
    step: int  # the global step
    rank: int
    graphs: int
    atoms: int
    edges: int
    data_s: float
    compute_s: float
    wait_s: float
    allreduce_s: float
    optim_s: float
    step_s: float
    loss: float
    cpu_s: float
    compute_cpu_s: float

    TABLE = "steps.csv"
    WRITER = "`cfmtrain train`"
    # The CPU times came later: a steps.csv of an older version lacks them.
    OPTIONAL = ("cpu_s", "compute_cpu_s")


STEP_FIELDS: tuple[str, ...] = StepRecord.columns()
