"""The three trainings of `cfmtrain bench accuracy` and their validation curves: cfmtrain
`baseline` and `both` (through `cfmtrain launch`) and mace-torch's own `mace_run_train`, on the
same graphs, split, model, epochs, E0s and batch settings.

Each curve has one row per epoch: the cumulative training wall time up to the end of that
epoch's validation, and the validation MAEs in meV/atom and meV/Å. cfmtrain's time is the sum
of its epochs.csv `wall_s + valid_s`; mace_run_train's is the time stamp of its "Epoch N" log
line (written right after that epoch's validation) minus that of its "Initial" line (the
validation before any training, which cfmtrain does not do). Start-up and the final test
evaluation are outside both; each process's whole wall time is reported beside them.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from cfmtrain.bench.baseline_check import (
    export_extxyz,
    mace_arguments,
    mace_process,
    mace_records,
    subprocess_env,
)
from cfmtrain.simulate.runs import read_steps
from cfmtrain.train.config import TrainConfig, to_dict
from cfmtrain.train.model import stats_of

MACE = "mace_run_train"
MACE_NAME = "accuracy"  # mace_run_train's --name
CURVE_FIELDS = ("run", "epoch", "wall_s", "valid_mae_e_meV_per_atom", "valid_mae_f_meV_per_A")
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


def cfmtrain_curve(run: str, epochs: pd.DataFrame) -> pd.DataFrame:
    """A cfmtrain run's curve from its epochs.csv (energies in eV/atom, forces in eV/Å)."""
    return pd.DataFrame({
        "run": run, "epoch": epochs.epoch.astype(int),
        "wall_s": (epochs.wall_s + epochs.valid_s).cumsum(),
        "valid_mae_e_meV_per_atom": 1000 * epochs.valid_mae_energy_per_atom,
        "valid_mae_f_meV_per_A": 1000 * epochs.valid_mae_forces})[list(CURVE_FIELDS)]


def run_cfmtrain(bench: Bench, variant: str, epochs: int, resume: bool = False) -> RunResult:
    """`cfmtrain launch --ranks R -- train --variant <variant>` into work/<variant> for `epochs`
    epochs in all: afresh, or with `resume` continued from the folder's checkpoint (the same
    trajectory as one longer run; process start-up is not in the curve's times)."""
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
    log = bench.work / f"{variant}.log"
    t0 = time.perf_counter()
    with open(log, "a" if resume else "w") as out:
        done = subprocess.run(command, env=subprocess_env(bench.rank_threads), stdout=out,
                              stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"cfmtrain train --variant {variant} failed ({done.returncode}); "
                           f"see {log}")
    epochs_csv = pd.read_csv(folder / "epochs.csv")
    steps = read_steps(folder / "steps.csv")
    return RunResult(cfmtrain_curve(variant, epochs_csv), {
        "steps_per_epoch": int(epochs_csv.steps.iloc[-1]), "process_wall_s": wall,
        "data_wait_pct": float(100 * steps.data_s.sum() / steps.step_s.sum()),
        "e0s": model_e0s(folder / "final.model"),
        "capacity": json.loads((folder / "summary.json").read_text())["capacity"]})


def log_times(log: Path) -> dict[int | None, float]:
    """Seconds since mace_run_train's "Initial" validation line of each "Epoch N" line
    (key N; the Initial line itself is key None, at 0)."""
    stamps: dict[int | None, datetime.datetime] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = LOG_LINE.match(line)
        if match:
            epoch = None if match[2] == "Initial" else int(match[3])
            stamps.setdefault(epoch, datetime.datetime.strptime(match[1],
                                                                "%Y-%m-%d %H:%M:%S.%f"))
    if None not in stamps:
        raise ValueError(f"{log}: no 'Initial' validation line of mace_run_train")
    return {k: (v - stamps[None]).total_seconds() for k, v in stamps.items()}


def mace_curve(records: list[dict], times: dict[int | None, float]) -> pd.DataFrame:
    """mace_run_train's curve from its per-epoch eval records (eV/atom and eV/Å) and the
    times of its log lines."""
    rows = [{"run": MACE, "epoch": int(r["epoch"]), "wall_s": times[int(r["epoch"])],
             "valid_mae_e_meV_per_atom": 1000 * float(r["mae_e_per_atom"]),
             "valid_mae_f_meV_per_A": 1000 * float(r["mae_f"])}
            for r in records if r.get("epoch") is not None]
    return pd.DataFrame(rows, columns=list(CURVE_FIELDS))


def run_mace(bench: Bench, store, parts: dict[str, np.ndarray], e0s: dict[int, float]
             ) -> RunResult:
    """mace_run_train in work/mace_run_train on the same training and validation graphs,
    with the E0s given as an explicit dict."""
    folder = bench.work / MACE
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    export_extxyz(store, parts["train"], folder / "train.xyz")
    export_extxyz(store, parts["valid"], folder / "valid.xyz")
    r_max = bench.cfg.model.r_max or store.cutoff
    arguments = mace_arguments(bench.cfg, r_max, folder, name=MACE_NAME, e0s=repr(e0s),
                               batch_size=bench.ranks * bench.cfg.batch.graphs_per_batch)
    wall = mace_process(arguments, folder, subprocess_env(bench.threads))
    records = mace_records(folder, MACE_NAME, bench.cfg.seed, "eval")
    curve = mace_curve(records, log_times(folder / "mace_run_train.log"))
    steps = mace_records(folder, MACE_NAME, bench.cfg.seed, "opt")
    return RunResult(curve, {
        "steps_per_epoch": sum(1 for s in steps if s["epoch"] == steps[-1]["epoch"]),
        "process_wall_s": wall, "e0s": model_e0s(folder / f"{MACE_NAME}.model")})
