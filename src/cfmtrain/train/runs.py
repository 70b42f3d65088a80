"""Training runs' results folders as other stages read them: the fields of summary.json they use
(RunSummary, and the epoch times' one writer), steps.csv (StepRecord) and epochs.csv
(EpochRecord); a file that lacks one is an error naming the file and what it lacks.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from cfmtrain.tables import Record, read_table
from cfmtrain.train.epochs import EpochRecord
from cfmtrain.train.steps import StepRecord

_RUN_DIR = re.compile(r"(?P<dataset>[^/]+)/(?P<variant>[^/]+)/r(?P<ranks>\d+)$")


@dataclasses.dataclass(frozen=True)
class RunSummary(Record):
    """What other stages read of a run's summary.json: the run, its epoch time (seconds) with
    the min and max of the measurements it is the median of, and whether one was contended.

    A single run (`cfmtrain train`) has its mean epoch time alone (min = max = it); a cell
    (`cfmtrain cell`) the median over its repeats and the repeats themselves (`repeats`, a
    list); a group's run (`cfmtrain rounds`) the median over its rounds and their count
    (`rounds`). As a row, `repeats` is the count of those measurements (1: a single run).
    """

    dataset: str
    ranks: int
    variant: str
    epoch_time_s: float
    epoch_time_min_s: float
    epoch_time_max_s: float
    contended: bool
    repeats: int

    TABLE = "summary.json"
    WRITER = "`cfmtrain train`, `cfmtrain cell` or `cfmtrain rounds`"
    # a single run has its epoch time alone; an older summary may lack its data set
    OPTIONAL = ("dataset", "epoch_time_min_s", "epoch_time_max_s", "contended", "repeats")


def epoch_times(times: Sequence[float]) -> dict[str, float]:
    """summary.json's epoch time of a run measured several times (a cell's repeats, a group's
    rounds): their median, min and max."""
    times = np.asarray(times, dtype=np.float64)
    return {"epoch_time_s": float(np.median(times)), "epoch_time_min_s": float(times.min()),
            "epoch_time_max_s": float(times.max())}


@dataclasses.dataclass
class Run:
    """One training run's results folder."""

    folder: Path
    summary: dict

    @property
    def variant(self) -> str:
        return str(self.summary["variant"])

    @property
    def ranks(self) -> int:
        return int(self.summary["ranks"])

    @property
    def dataset(self) -> str:
        if "dataset" in self.summary:
            return str(self.summary["dataset"])
        match = _RUN_DIR.search(self.folder.resolve().as_posix())
        if not match:
            raise ValueError(f"{self.folder}: summary.json has no `dataset` and the folder is not "
                             "results/train/<dataset>/<variant>/r<ranks>")
        return match["dataset"]

    @property
    def epoch_time_s(self) -> float:
        return float(self.summary["epoch_time_s"])

    @property
    def contended(self) -> bool:
        """Whether a repeat of the run was flagged contended (`cfmtrain cell`)."""
        return bool(self.summary.get("contended", False))

    @property
    def repeats(self) -> list[dict]:
        """A cell's repeats, each with its epoch time and contention measures (measure.repeats);
        [] for another run."""
        repeats = self.summary.get("repeats")
        return repeats if isinstance(repeats, list) else []

    def record(self) -> RunSummary:
        """The run as a row: its epoch time with min and max, contention and count; epoch times
        that are not positive numbers, or a median outside its min and max, are an error
        naming the summary."""
        s, where = self.summary, self.folder / "summary.json"
        try:
            median = self.epoch_time_s
            low = float(s.get("epoch_time_min_s", median))
            high = float(s.get("epoch_time_max_s", median))
        except (TypeError, ValueError):
            raise ValueError(f"{where}: epoch times must be numbers, got epoch_time_s "
                             f"{s.get('epoch_time_s')!r}, min {s.get('epoch_time_min_s')!r}, max "
                             f"{s.get('epoch_time_max_s')!r}") from None
        if not all(math.isfinite(v) and v > 0 for v in (median, low, high)):
            raise ValueError(f"{where}: epoch times must be positive numbers, got median "
                             f"{median}, min {low}, max {high}")
        if not low <= median <= high:
            raise ValueError(f"{where}: epoch_time_s {median} is not within its repeats' min "
                             f"{low} and max {high}")
        repeats = s.get("repeats")  # a cell's repeats; a group's run has its rounds' count
        count = len(repeats) if isinstance(repeats, list) else int(s.get("rounds", 1))
        return RunSummary(self.dataset, self.ranks, self.variant, median, low, high,
                          self.contended, count)

    def steps(self) -> pd.DataFrame:
        """steps.csv: one row per (step, rank)."""
        return read_table(self.folder / "steps.csv", StepRecord)

    def epochs(self) -> pd.DataFrame:
        """epochs.csv: one row per epoch."""
        return read_table(self.folder / "epochs.csv", EpochRecord)


def load_run(path: str | Path) -> Run:
    """A run from its folder or its summary.json."""
    path = Path(path)
    folder = path.parent if path.name == "summary.json" else path
    summary_path = folder / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path}: missing (written by {RunSummary.WRITER})")
    try:
        summary = json.loads(summary_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{summary_path}: not JSON ({err})") from None
    missing = RunSummary.missing(summary)
    if missing:
        raise ValueError(f"{summary_path}: missing keys {missing}")
    return Run(folder, summary)


def load_runs(paths: list[str | Path]) -> list[Run]:
    """Runs from folders or summary.json files, in the given order."""
    if not paths:
        raise ValueError("no training runs given")
    return [load_run(p) for p in paths]
