"""The three trainings of `cfmtrain bench accuracy` and their validation curves: cfmtrain
`baseline` and `both` (through `cfmtrain launch`) and mace-torch's own `mace_run_train`, on the
same graphs, split, model, epochs, E0s and batch settings.

The three train in paired rounds (`train_paired`): each is a process run one epoch per turn
(measure.turns), and a round is one epoch of each, in an order shuffled with the seed
(measure.paired.run_rounds), so a slow minute of a shared host falls on one round's epochs
and cancels in their ratios. The processes wait stopped while another has its turn.

Each curve has one row per epoch: the cumulative training wall time up to the end of that
epoch's validation, and the validation MAEs in meV/atom and meV/Å. An epoch's time is the
run's own measure less the time its process was stopped within it: cfmtrain's epochs.csv
`wall_s + valid_s` (ending at `ended_unix_s`); mace_run_train's time between the time stamps
of its "Epoch N" log lines (written right after that epoch's validation), the first epoch
counted from its "Initial" line (the validation before any training, which cfmtrain does not
do). Start-up and the final test evaluation are outside both; each process's whole running
time is reported beside them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from cfmtrain.bench.baseline_check import (
    MACE_EPOCH,
    export_extxyz,
    mace_arguments,
    mace_command,
    mace_records,
    subprocess_env,
)
from cfmtrain.measure.paired import Rounds, run_rounds
from cfmtrain.measure.turns import EpochTurns, stopped_within
from cfmtrain.tables import Record, read_table
from cfmtrain.train.config import TrainConfig, to_dict
from cfmtrain.train.epochs import EpochRecord
from cfmtrain.train.model import stats_of
from cfmtrain.train.steps import StepRecord
from cfmtrain.train.summary import read_rows

MACE = "mace_run_train"
MACE_NAME = "accuracy"  # mace_run_train's --name


@dataclasses.dataclass(frozen=True)
class CurvePoint(Record):
    """One epoch of a run's validation curve (accuracy_<name>.csv, a seed column first): the
    cumulative training wall time up to the end of its validation (seconds), and the
    validation MAEs."""

    run: str
    epoch: int
    wall_s: float
    valid_mae_e_meV_per_atom: float
    valid_mae_f_meV_per_A: float

    TABLE = "accuracy curve"
    WRITER = "`cfmtrain bench accuracy`"


CURVE_FIELDS = CurvePoint.columns()
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) INFO: (Initial|Epoch (\d+)):")


@dataclasses.dataclass
class Bench:
    """What the runs share. cfmtrain runs `ranks` ranks of threads // ranks threads each, with
    cfg's graphs per batch per rank; mace_run_train runs one process of `threads` threads with
    ranks x graphs per batch, the same graphs per optimiser step."""

    cfg: TrainConfig
    graphs: list[Path]
    split: Path
    ranks: int
    threads: int
    work: Path

    @property
    def rank_threads(self) -> int:
        """Threads of each cfmtrain rank."""
        return max(1, self.threads // self.ranks)


@dataclasses.dataclass
class RunResult:
    """One run's validation curve (CURVE_FIELDS) and facts about it."""

    curve: pd.DataFrame
    info: dict


def model_e0s(path: Path) -> dict[int, float]:
    """{Z: E0 in eV} of a saved mace-torch model (a full pickle written by this benchmark)."""
    import torch

    stats = stats_of(torch.load(path, map_location="cpu", weights_only=False))
    return dict(zip(stats.zs, stats.e0s, strict=True))


def cfmtrain_times(epochs: pd.DataFrame, stops: list = ()) -> np.ndarray:
    """Cumulative seconds at the end of each epoch of a cfmtrain run's epochs.csv, each epoch's
    time less its process's `stops` within it."""
    own = (epochs.wall_s + epochs.valid_s).to_numpy(float)
    ended = epochs.ended_unix_s.to_numpy(float)
    own = own - [stopped_within(stops, end - d, end) for d, end in zip(own, ended, strict=True)]
    return np.cumsum(own)


def cfmtrain_curve(run: str, epochs: pd.DataFrame, stops: list = ()) -> pd.DataFrame:
    """A cfmtrain run's curve from its epochs.csv (energies in eV/atom, forces in eV/Å)."""
    return pd.DataFrame({
        "run": run, "epoch": epochs.epoch.astype(int), "wall_s": cfmtrain_times(epochs, stops),
        "valid_mae_e_meV_per_atom": 1000 * epochs.valid_mae_energy_per_atom,
        "valid_mae_f_meV_per_A": 1000 * epochs.valid_mae_forces})[list(CURVE_FIELDS)]


def cfmtrain_process(bench: Bench, variant: str, epochs: int, resume: bool = False
                     ) -> EpochTurns:
    """`cfmtrain launch --ranks R -- train --variant <variant>` into work/<variant> for `epochs`
    epochs in all, not started yet: afresh, or with `resume` continued from the folder's
    checkpoint (the same trajectory as one longer run)."""
    folder = bench.work / variant
    if not resume:
        shutil.rmtree(folder, ignore_errors=True)
    config = bench.work / f"{variant}.yaml"
    settings = to_dict(bench.cfg) | {"threads": bench.rank_threads, "variant": variant,
                                     "epochs": epochs}
    config.write_text(yaml.safe_dump(settings))
    command = [sys.executable, "-m", "cfmtrain", "launch", "--ranks", str(bench.ranks),
               "--threads", str(bench.rank_threads), "--", "train", "--graphs",
               *map(str, bench.graphs), "--split", str(bench.split), "--output", str(folder),
               "--config", str(config), *(["--resume", "auto"] if resume else [])]
    return EpochTurns(f"cfmtrain train --variant {variant}", command,
                      bench.work / f"{variant}.log",
                      lambda: len(read_rows(folder / EpochRecord.TABLE)),
                      env=subprocess_env(bench.rank_threads), append=resume)


def cfmtrain_result(bench: Bench, variant: str, process: EpochTurns, stops: list = ()
                    ) -> RunResult:
    """A finished cfmtrain run's curve and facts; `stops` are those of earlier processes of
    the run (before a resume), whose epochs its epochs.csv keeps."""
    folder = bench.work / variant
    epochs_csv = read_table(folder / EpochRecord.TABLE, EpochRecord)
    steps = read_table(folder / StepRecord.TABLE, StepRecord)
    stops = [*stops, *process.stops]
    return RunResult(cfmtrain_curve(variant, epochs_csv, stops), {
        "stops": stops, "stopped_s": sum(b - a for a, b in stops),
        "steps_per_epoch": int(epochs_csv.steps.iloc[-1]), "process_wall_s": process.running_s,
        "data_wait_pct": float(100 * steps.data_s.sum() / steps.step_s.sum()),
        "e0s": model_e0s(folder / "final.model"),
        "capacity": json.loads((folder / "summary.json").read_text())["capacity"]})


def run_cfmtrain(bench: Bench, variant: str, epochs: int, resume: bool = False,
                 stops: list = ()) -> RunResult:
    """A cfmtrain run trained to its end alone (as the extra epochs are); `stops` as in
    cfmtrain_result."""
    with cfmtrain_process(bench, variant, epochs, resume) as process:
        process.finish()
    return cfmtrain_result(bench, variant, process, stops)


def log_stamps(log: Path) -> dict[int | None, float]:
    """Wall-clock time (Unix seconds) of mace_run_train's "Initial" validation line (key None)
    and of each "Epoch N" line (key N)."""
    stamps: dict[int | None, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = LOG_LINE.match(line)
        if match:
            epoch = None if match[2] == "Initial" else int(match[3])
            stamp = datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S.%f")
            stamps.setdefault(epoch, stamp.timestamp())  # logging's stamps: local time
    return stamps


def mace_times(stamps: dict[int | None, float], stops: list = ()) -> dict[int, float]:
    """Cumulative seconds at the end of each epoch of mace_run_train from the stamps of its
    log lines (`log_stamps`), each epoch's time less its process's `stops` within it."""
    if None not in stamps:
        raise ValueError("no 'Initial' validation line of mace_run_train in its log")
    times, wall, before = {}, 0.0, stamps[None]
    for epoch in sorted(k for k in stamps if k is not None):
        wall += stamps[epoch] - before - stopped_within(stops, before, stamps[epoch])
        times[epoch], before = wall, stamps[epoch]
    return times


def mace_curve(records: list[dict], times: dict[int, float]) -> pd.DataFrame:
    """mace_run_train's curve from its per-epoch eval records (eV/atom and eV/Å) and the
    times of its epochs (`mace_times`)."""
    rows = [{"run": MACE, "epoch": int(r[MACE_EPOCH]), "wall_s": times[int(r[MACE_EPOCH])],
             "valid_mae_e_meV_per_atom": 1000 * float(r["mae_e_per_atom"]),
             "valid_mae_f_meV_per_A": 1000 * float(r["mae_f"])}
            for r in records if r.get(MACE_EPOCH) is not None]
    return pd.DataFrame(rows, columns=list(CURVE_FIELDS))


def mace_process(bench: Bench, store, parts: dict[str, np.ndarray], e0s: dict[int, float]
                 ) -> EpochTurns:
    """mace_run_train in work/mace_run_train on the same training and validation graphs,
    with the E0s given as an explicit dict and its element table their elements; not started
    yet.

    The E0s (and so cfmtrain's models) cover every element of the split's parts; left to
    itself, mace_run_train's table holds only those of its training and validation files, and
    E0s of an element beyond it fail its model's shapes. So the table is given explicitly: the
    three runs' models share one."""
    folder = bench.work / MACE
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    export_extxyz(store, parts["train"], folder / "train.xyz")
    export_extxyz(store, parts["valid"], folder / "valid.xyz")
    r_max = bench.cfg.model.r_max or store.cutoff
    arguments = mace_arguments(bench.cfg, r_max, folder, name=MACE_NAME, e0s=repr(e0s),
                               batch_size=bench.ranks * bench.cfg.batch.graphs_per_batch)
    arguments.append(f"--atomic_numbers={sorted(int(z) for z in e0s)}")
    log = folder / "mace_run_train.log"
    return EpochTurns(MACE, mace_command(arguments), log,
                      lambda: sum(k is not None for k in log_stamps(log)),
                      env=subprocess_env(bench.threads), cwd=folder)


def mace_result(bench: Bench, process: EpochTurns) -> RunResult:
    """A finished mace_run_train's curve and facts."""
    folder = bench.work / MACE
    records = mace_records(folder, MACE_NAME, bench.cfg.seed, "eval")
    curve = mace_curve(records, mace_times(log_stamps(process.log), process.stops))
    steps = mace_records(folder, MACE_NAME, bench.cfg.seed, "opt")
    return RunResult(curve, {
        "steps_per_epoch": sum(1 for s in steps if s[MACE_EPOCH] == steps[-1][MACE_EPOCH]),
        "process_wall_s": process.running_s, "stopped_s": sum(b - a for a, b in process.stops),
        "e0s": model_e0s(folder / f"{MACE_NAME}.model")})


def _last_epoch_s(process: EpochTurns, times) -> float:
    """One turn of `process`: its newest epoch's own seconds (`times(process)`: the cumulative
    seconds at the end of each epoch so far)."""
    process.turn()
    wall = np.asarray(times(process), float)
    return float(wall[-1] - (wall[-2] if len(wall) > 1 else 0.0))


def train_paired(bench: Bench, store, parts: dict[str, np.ndarray], e0s: dict[int, float],
                 variants: tuple[str, ...]) -> tuple[dict[str, RunResult], Rounds]:
    """cfmtrain's `variants` and mace_run_train trained in paired rounds of one epoch each
    (order shuffled with the config's seed), then each finished alone: their results and the
    rounds (each run's own epoch seconds)."""
    def cfmtrain_epochs(variant: str):
        path = bench.work / variant / EpochRecord.TABLE
        return lambda p: cfmtrain_times(read_table(path, EpochRecord), p.stops)

    def mace_epochs(p: EpochTurns) -> list[float]:
        return list(mace_times(log_stamps(p.log), p.stops).values())

    with contextlib.ExitStack() as stack:
        processes = {v: stack.enter_context(cfmtrain_process(bench, v, bench.cfg.epochs))
                     for v in variants}
        processes[MACE] = stack.enter_context(mace_process(bench, store, parts, e0s))
        times = {**{v: cfmtrain_epochs(v) for v in variants}, MACE: mace_epochs}
        arms = {run: (lambda p=processes[run], t=times[run]: _last_epoch_s(p, t))
                for run in processes}
        rounds = run_rounds(arms, bench.cfg.epochs, seed=bench.cfg.seed)
        for process in processes.values():
            process.finish()
    results = {v: cfmtrain_result(bench, v, processes[v]) for v in variants}
    results[MACE] = mace_result(bench, processes[MACE])
    return results, rounds
