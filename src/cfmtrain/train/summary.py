"""Run outputs written by rank 0: steps.csv, epochs.csv (their records: train.steps,
train.epochs), test_mae.csv and summary.json with the provenance (commit, package versions,
kernel backend, op-library build, threads, dtype).
"""

from __future__ import annotations

import csv
import functools
import importlib.metadata
import json
import math
import platform
import subprocess
from pathlib import Path

import numpy as np
import torch
from ase.data import chemical_symbols

from cfmtrain.atomic import atomic_path
from cfmtrain.digest import new_hasher
from cfmtrain.kernels import dense, isa
from cfmtrain.train.config import to_dict
from cfmtrain.train.diskfull import appending, writing
from cfmtrain.train.steps import STEP_FIELDS

PACKAGES = ("cfmtrain", "torch", "mace-torch", "e3nn", "numpy", "cuequivariance-torch")
FIRST_TIMED_EPOCH = 1  # the first epoch (index 0) is warm-up, left out of the epoch time


def read_rows(path: Path) -> list[dict]:
    """Rows of a CSV written earlier (empty if absent), values as strings."""
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_rows(path: Path, fields: tuple[str, ...], rows: list) -> None:
    """Write rows (dicts or sequences in `fields` order) atomically."""
    with writing(path), atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(fields)
        for row in rows:
            writer.writerow([row[k] for k in fields] if isinstance(row, dict) else row)


def append_rows(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    """Append rows (dicts) to a CSV, its header first when the file is new; an append that
    fails leaves the file as it was."""
    new = not path.exists()
    with appending(path), open(path, "a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(fields)
        writer.writerows([row[k] for k in fields] for row in rows)


def compute_balance(records: np.ndarray, ranks: int) -> tuple[float, float]:
    """(max over ranks / mean over ranks) of the summed compute time, and mean straggler wait
    per step, from the epoch's step records of all ranks (columns: steps.STEP_FIELDS)."""
    rank, compute, wait = (records[:, STEP_FIELDS.index(name)]
                           for name in ("rank", "compute_s", "wait_s"))
    per_rank = np.zeros(ranks)
    np.add.at(per_rank, rank.astype(int), compute)
    ratio = float(per_rank.max() / per_rank.mean()) if per_rank.mean() > 0 else math.nan
    return ratio, float(np.nanmean(wait)) if np.isfinite(wait).any() else math.nan


def git_commit(start: Path) -> str:
    """The commit of the repository holding `start` (with '+dirty'), or 'unknown'."""
    try:
        out = subprocess.run(["git", "-C", str(start), "describe", "--always", "--dirty=+dirty",
                              "--abbrev=40"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


@functools.cache
def code_version() -> dict:
    """The cfmtrain this process runs: its git commit ('+dirty' with uncommitted edits,
    'unknown' outside a checkout), package version and a digest of the package's Python sources
    (which tells apart edits that one '+dirty' commit, or an installed copy, does not)."""
    package = Path(__file__).parents[1]
    hasher = new_hasher()
    for path in sorted(package.rglob("*.py")):
        hasher.update(f"{path.relative_to(package).as_posix()}\0".encode())
        hasher.update(path.read_bytes())
    try:
        version = importlib.metadata.version("cfmtrain")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"commit": git_commit(package), "version": version,
            "sources": hasher.hexdigest()[:16]}


def provenance(run) -> dict:
    """Where the numbers come from."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {"commit": git_commit(Path(__file__).parent), "packages": versions,
            "python": platform.python_version(), "host": platform.node(),
            "kernel_backend": run.kernel_backend, "threads": torch.get_num_threads(),
            "dtype": run.cfg.model.dtype, "device": str(run.device),
            "launcher": run.env.source, "use_reduced_cg": run.cfg.model.use_reduced_cg,
            "cpu_variant": isa.cpu_variant(), "gemm": gemm_backend(),
            "host_backend": getattr(run, "host_backend", {})}


def gemm_backend() -> str | None:
    """Which product the fused ops' float32 tiles ran on ("avx512" or "aten",
    cfmtrain.kernels.dense.gemm_backend), None where no fused op was loaded."""
    if isa.loaded("cfmtrain._ops_dense_mm") is None:
        return None
    return dense.gemm_backend()


def summarize(run, epochs: list[dict], test: dict, mean_batch: dict, host: dict) -> dict:
    """summary.json: the run's results; epoch_time_s is the mean over epochs after the first;
    `host`: the load, steal and compute wall/CPU measures (train.contention)."""
    walls = [float(e["wall_s"]) for e in epochs]
    timed = walls[FIRST_TIMED_EPOCH:] if len(walls) > FIRST_TIMED_EPOCH else walls
    last = epochs[-1] if epochs else {}
    return {
        "dataset": run.dataset, "variant": run.cfg.variant, "ranks": run.env.world_size,
        "epochs": len(epochs),
        "epoch_time_s": float(np.mean(timed)) if timed else math.nan,
        "epoch_times_s": walls,
        # epochs resumed part-way (their wall time spans two processes)
        "resumed_epochs": [int(e["epoch"]) for e in epochs if int(e["resumed"])],
        "steps_per_epoch": int(last.get("steps", 0) or 0),
        "final_train_loss": float(last.get("train_loss", math.nan)),
        "val_mae_energy_per_atom": float(last.get("valid_mae_energy_per_atom", math.nan)),
        "val_mae_forces": float(last.get("valid_mae_forces", math.nan)),
        "test_mae_energy_per_atom": test.get("mae_energy_per_atom", math.nan),
        "test_mae_forces": test.get("mae_forces", math.nan),
        "atoms_per_s": float(last.get("atoms_per_s", math.nan)),
        "compute_max_over_mean": float(last.get("compute_max_over_mean", math.nan)),
        "graphs": {k: int(len(v)) for k, v in run.parts.items()},
        "train_fraction": run.cfg.train_fraction,
        "eval_fraction": run.cfg.eval_fraction,
        **mean_batch,
        "stats": {"avg_num_neighbors": run.stats.avg_num_neighbors, "zs": run.stats.zs},
        "e0s": {"method": run.stats.e0s_method,
                "eV": {chemical_symbols[z]: e for z, e in zip(run.stats.zs, run.stats.e0s,
                                                              strict=True)}},
        "capacity": run.capacity.as_dict(),
        "host": host,
        "provenance": provenance(run),
        # every code version that trained the run, from the step each took over at
        "code_versions": run.code_versions,
        "config": to_dict(run.cfg),
    }


def write_json(path: Path, data: dict) -> None:
    """JSON (NaN written as null) atomically."""
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    with writing(path), atomic_path(path) as tmp:
        tmp.write_text(json.dumps(clean(data), indent=2) + "\n")
