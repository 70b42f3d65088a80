"""Reading the training runs' results folders: summary.json, steps.csv and epochs.csv.

The column names are those that cfmtrain.train writes (steps.csv: cfmtrain.train.steps); a file
that lacks one is an error that names the file and the column.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pandas as pd

from cfmtrain.train.steps import CPU_FIELDS, STEP_FIELDS

# What steps.csv (per step and rank) and epochs.csv (per epoch) must hold: every StepRecord
# field but the CPU times, which a steps.csv of an older version lacks.
STEP_COLUMNS = tuple(name for name in STEP_FIELDS if name not in CPU_FIELDS)
EPOCH_COLUMNS = ("epoch", "wall_s", "train_loss")
SUMMARY_KEYS = ("variant", "ranks", "epoch_time_s")
_RUN_DIR = re.compile(r"(?P<dataset>[^/]+)/(?P<variant>[^/]+)/r(?P<ranks>\d+)$")


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

    def steps(self) -> pd.DataFrame:
        """steps.csv: one row per (step, rank)."""
        return read_steps(self.folder / "steps.csv")

    def epochs(self) -> pd.DataFrame:
        """epochs.csv: one row per epoch."""
        return read_csv(self.folder / "epochs.csv", EPOCH_COLUMNS)


def read_csv(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """A CSV that must hold `columns` and at least one row."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (written by `cfmtrain train`)")
    frame = pd.read_csv(path)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}; has {list(frame.columns)}")
    if frame.empty:
        raise ValueError(f"{path}: no rows")
    return frame


def read_steps(path: Path) -> pd.DataFrame:
    """A steps.csv (cfmtrain.train.steps.StepRecord's columns): one row per (step, rank)."""
    return read_csv(path, STEP_COLUMNS)


def load_run(path: str | Path) -> Run:
    """A run from its folder or its summary.json."""
    path = Path(path)
    folder = path.parent if path.name == "summary.json" else path
    summary_path = folder / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path}: missing (written by `cfmtrain train`)")
    try:
        summary = json.loads(summary_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{summary_path}: not JSON ({err})") from None
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if missing:
        raise ValueError(f"{summary_path}: missing keys {missing}")
    return Run(folder, summary)


def load_runs(paths: list[str | Path]) -> list[Run]:
    """Runs from folders or summary.json files, in the given order."""
    if not paths:
        raise ValueError("no training runs given")
    return [load_run(p) for p in paths]
