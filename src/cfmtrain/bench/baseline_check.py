"""The baseline is not a straw man: mace-torch's own `mace_run_train` and `cfmtrain train
--variant baseline` on the same graphs and settings, one process each, step times compared.

A step is timed the same way on both sides: batch to device, forward, backward, clipping, Adam
and EMA (mace-torch's `take_step` "time"; cfmtrain's compute_s + optim_s), data loading excluded.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from cfmtrain import children
from cfmtrain.bench.table import report
from cfmtrain.frames.labels import ENERGY_KEY, FORCES_KEY, STRESS_KEY
from cfmtrain.graphs.store import GraphStore
from cfmtrain.malloc_env import MALLOC_ENV
from cfmtrain.measure.paired import run_rounds
from cfmtrain.ranks.distenv import DistEnv, available_cpus
from cfmtrain.tables import read_table
from cfmtrain.train.build import build_run, load_parts, param_groups
from cfmtrain.train.config import TrainConfig, load_config, to_dict
from cfmtrain.train.loop import train_step
from cfmtrain.train.metrics import StepTimes
from cfmtrain.train.model import z_table_of
from cfmtrain.train.selection import planned_start
from cfmtrain.train.steps import StepRecord
from cfmtrain.train.summary import write_json

TOLERANCE = 0.10
MACE_EPOCH = "epoch"  # mace_run_train's records (its results' train.txt): the epoch of one


def export_extxyz(store, indices: np.ndarray, path: Path) -> None:
    """Graphs of the store as extxyz frames with mace-torch's REF_* keys."""
    import ase.io
    from ase import Atoms

    frames = []
    for index in indices:
        g = store[int(index)]
        atoms = Atoms(numbers=g["numbers"], positions=g["positions"], cell=g["cell"], pbc=g["pbc"])
        atoms.info[ENERGY_KEY] = g["energy"]
        atoms.arrays[FORCES_KEY] = g["forces"]
        if "stress" in g:
            atoms.info[STRESS_KEY] = g["stress"]
        frames.append(atoms)
    ase.io.write(path, frames, format="extxyz")


def mace_arguments(cfg: TrainConfig, r_max: float, work: Path, *, name: str = "check",
                   e0s: str = "average", batch_size: int | None = None) -> list[str]:
    """mace_run_train options equal to cfmtrain's baseline settings `cfg`: run `name` in
    `work`, E0s `e0s` ("average" or a dict's repr, {Z: eV}), `batch_size` graphs per step
    (default: cfg's graphs per batch of one rank)."""
    m, b, o = cfg.model, cfg.batch, cfg.optim
    options = {
        "name": name, "seed": cfg.seed, "work_dir": work, "train_file": work / "train.xyz",
        "valid_file": work / "valid.xyz", "E0s": e0s, "model": "ScaleShiftMACE",
        "scaling": "rms_forces_scaling", "interaction": "RealAgnosticResidualInteractionBlock",
        "interaction_first": "RealAgnosticResidualInteractionBlock",
        "hidden_irreps": m.hidden_irreps, "num_interactions": m.num_interactions,
        "max_ell": m.max_ell, "correlation": m.correlation, "num_radial_basis": m.num_bessel,
        "num_cutoff_basis": m.num_polynomial_cutoff, "radial_MLP": str(list(m.radial_mlp)),
        "MLP_irreps": m.mlp_irreps, "r_max": r_max,
        "batch_size": batch_size or b.graphs_per_batch,
        "valid_batch_size": b.valid_graphs_per_batch, "max_num_epochs": cfg.epochs,
        "lr": o.lr, "weight_decay": o.weight_decay, "ema_decay": o.ema_decay,
        "scheduler": "ReduceLROnPlateau", "lr_factor": o.lr_factor,
        "scheduler_patience": o.patience, "loss": "weighted", "energy_weight": o.energy_weight,
        "forces_weight": o.forces_weight, "clip_grad": o.clip_grad, "default_dtype": m.dtype,
        "device": "cpu", "num_workers": b.num_workers or 0, "use_reduced_cg": m.use_reduced_cg,
        "energy_key": ENERGY_KEY, "forces_key": FORCES_KEY, "stress_key": STRESS_KEY,
        "error_table": "PerAtomMAE", "eval_interval": 1,
    }
    if not o.amsgrad:
        raise ValueError("baseline check: mace_run_train always uses amsgrad (optim.amsgrad)")
    if o.scheduler == "exponential":
        options.update(scheduler="ExponentialLR", lr_scheduler_gamma=o.gamma)
    elif o.scheduler != "plateau":
        raise ValueError(f"optim.scheduler {o.scheduler}: mace_run_train has no such schedule "
                         "(plateau or exponential)")
    if o.stress_weight > 0:  # mace-torch's --loss stress, on the frames that have one
        options.update(loss="stress", stress_weight=o.stress_weight, compute_stress=True)
    if cfg.patience > 0:
        options["patience"] = cfg.patience
    flags = ["--ema"] if o.ema_decay > 0 else []
    start, two = planned_start(cfg), cfg.stage_two
    if start is not None:  # cfmtrain's stage two is mace-torch's, from the same epoch
        flags.append("--stage_two")
        options.update(start_stage_two=start, stage_two_lr=two.lr,
                       stage_two_energy_weight=two.energy_weight,
                       stage_two_forces_weight=two.forces_weight,
                       stage_two_stress_weight=two.stress_weight)
    return [*(f"--{k}={v}" for k, v in options.items()), *flags, "--save_cpu"]


def step_stats(times: np.ndarray, epochs: np.ndarray) -> dict:
    """Mean and median step time over the epochs after the first (all if only one)."""
    later = times[epochs > epochs.min()] if (epochs > epochs.min()).any() else times
    return {"steps": int(len(times)), "timed_steps": int(len(later)),
            "step_s_mean": float(later.mean()), "step_s_median": float(np.median(later))}


def subprocess_env(threads: int) -> dict:
    """This environment for a training subprocess: no torchrun rank variables, the allocator
    settings, `threads` OpenMP threads, Python warnings off."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(MALLOC_ENV, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
    return env


def mace_command(arguments: list[str]) -> list[str]:
    """The mace_run_train script with `arguments`, run by this interpreter (the script may not
    be on PATH)."""
    return [sys.executable, "-m", "mace.cli.run_train", *arguments]


def mace_process(arguments: list[str], work: Path, env: dict) -> float:
    """mace_run_train with `arguments` in a subprocess in `work` (its output in
    work/mace_run_train.log); the process's wall seconds."""
    command = mace_command(arguments)
    t0 = time.perf_counter()
    with open(work / "mace_run_train.log", "w") as log:
        done = children.run(command, env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"mace_run_train failed ({done.returncode}); see "
                           f"{work / 'mace_run_train.log'}")
    return wall


def mace_records(work: Path, name: str, seed: int, mode: str) -> list[dict]:
    """mace_run_train's JSON records of `mode` ("opt": per step, "eval": per validation) from
    work/results/<name>_run-<seed>_train.txt."""
    lines = (work / "results" / f"{name}_run-{seed}_train.txt").read_text().splitlines()
    return [d for d in map(json.loads, lines) if d.get("mode") == mode]


def run_mace(cfg: TrainConfig, r_max: float, work: Path, env: dict) -> dict:
    """mace_run_train in a subprocess; step times from its results/check_run-<seed>_train.txt."""
    wall = mace_process(mace_arguments(cfg, r_max, work), work, env)
    steps = mace_records(work, "check", cfg.seed, "opt")
    times = np.array([d["time"] for d in steps])
    epochs = np.array([d[MACE_EPOCH] for d in steps])
    return {"tool": "mace_run_train", **step_stats(times, epochs),
            "process_wall_s": wall}


def run_cfmtrain(cfg: TrainConfig, graphs: list[Path], split: Path, work: Path, env: dict
                 ) -> dict:
    """`cfmtrain train --variant baseline` in a subprocess; step times from steps.csv."""
    config_file = work / "cfmtrain.yaml"
    config_file.write_text(yaml.safe_dump(to_dict(cfg)))
    command = [sys.executable, "-m", "cfmtrain.train", "--graphs", *map(str, graphs), "--split",
               str(split), "--output", str(work / "cfmtrain"), "--config", str(config_file)]
    t0 = time.perf_counter()
    with open(work / "cfmtrain_train.log", "w") as log:
        done = children.run(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"cfmtrain train failed ({done.returncode}); see "
                           f"{work / 'cfmtrain_train.log'}")
    steps = read_table(work / "cfmtrain" / StepRecord.TABLE, StepRecord)
    times = (steps.compute_s + steps.optim_s).to_numpy()
    return {"tool": "cfmtrain train (baseline)", **step_stats(times, steps.epoch.to_numpy()),
            "data_wait_s_mean": float(steps.data_s.mean()), "process_wall_s": wall}


def _atoms(g: dict):
    from ase import Atoms

    atoms = Atoms(numbers=g["numbers"], positions=g["positions"], cell=g["cell"], pbc=g["pbc"])
    atoms.info[ENERGY_KEY] = g["energy"]
    atoms.arrays[FORCES_KEY] = g["forces"]
    return atoms


WARMUP_ROUNDS = 3


def interleaved(cfg: TrainConfig, graphs: list[Path], split: Path, rounds: int) -> dict:
    """Load-independent A/B in one process: mace-torch's `take_step` (its loss, its data from
    AtomicData.from_config) and cfmtrain's `train_step` in paired rounds (measure.paired), each
    round one step of each on the same graphs, in an order shuffled with the config's seed,
    from the same initial weights; the per-round ratios cfmtrain / mace of their step times."""
    import copy

    import torch
    from mace import modules
    from mace.data import AtomicData, config_from_atoms
    from mace.data.utils import KeySpecification
    from mace.tools.torch_geometric.dataloader import Collater
    from mace.tools.train import take_step
    from torch_ema import ExponentialMovingAverage

    run = build_run(cfg, graphs[0] if len(graphs) == 1 else graphs, split, Path("."),
                    DistEnv(cpus_per_task=torch.get_num_threads()), torch.device("cpu"))
    model = copy.deepcopy(run.model)
    optimizer = torch.optim.Adam(param_groups(model, cfg), lr=cfg.optim.lr, amsgrad=True)
    ema = ExponentialMovingAverage(model.parameters(), decay=cfg.optim.ema_decay)
    loss_fn = modules.WeightedEnergyForcesLoss(cfg.optim.energy_weight, cfg.optim.forces_weight)
    keys = KeySpecification(info_keys={"energy": ENERGY_KEY}, arrays_keys={"forces": FORCES_KEY})
    collate, z_table, r_max = Collater([None], [None]), z_table_of(model), float(model.r_max)
    order = np.random.default_rng(cfg.seed).permutation(len(run.train_set))
    g = cfg.batch.graphs_per_batch
    # each arm's k-th step trains on the k-th batch of the same sequence
    batches = [order[(r * g) % len(order):][:g].tolist() for r in range(WARMUP_ROUNDS + rounds)]
    steps = {"mace": iter(batches), "cfmtrain": iter(batches)}
    numbers = itertools.count()  # cfmtrain's step numbers (named in its errors)

    def mace_step() -> float:
        theirs = collate([AtomicData.from_config(
            config_from_atoms(_atoms(run.train_set.graph(i)), key_specification=keys),
            z_table=z_table, cutoff=r_max) for i in next(steps["mace"])])
        t0 = time.perf_counter()
        take_step(model, loss_fn, theirs, optimizer, ema, {"forces": True, "virials": False,
                  "stress": False}, cfg.optim.clip_grad or None, torch.device("cpu"))
        return time.perf_counter() - t0

    def cfmtrain_step() -> float:
        ours = collate([run.train_set[i] for i in next(steps["cfmtrain"])])
        step = StepTimes()
        train_step(run, ours, float(ours.num_graphs), float(ours.num_nodes), next(numbers),
                   step)
        return step.compute_s + step.optim_s

    paired = run_rounds({"mace": mace_step, "cfmtrain": cfmtrain_step}, rounds, seed=cfg.seed,
                        warmup=WARMUP_ROUNDS)
    ratio = paired.ratio("cfmtrain", "mace")  # = cfmtrain's step time / mace's, per round
    return {"rounds": rounds, "warmup_rounds": WARMUP_ROUNDS, "seed": paired.seed,
            **{f"{k}_step_s_median": float(np.median(paired.times(k))) for k in paired.names},
            **{f"{k}_step_s": paired.times(k).tolist() for k in paired.names},
            "order": [[paired.names[k] for k in row] for row in paired.order],
            **ratio.columns()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of the baseline check."""
    parser.add_argument("--graphs", type=Path, nargs="+", required=True,
                        help="graph store: a shard folder, or several (a union)")
    parser.add_argument("--dataset", help="data set name for the record")
    parser.add_argument("--split", type=Path, required=True, help="split .npz")
    parser.add_argument("--output", type=Path, required=True, help="JSON to write (CSV beside)")
    parser.add_argument("--config", type=Path, help="YAML of training config keys")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a training config key")
    parser.add_argument("--threads", type=int, default=0, help="threads (0: all CPUs)")
    parser.add_argument("--work-dir", type=Path, help="scratch folder (default: beside output)")
    parser.add_argument("--interleaved-rounds", type=int, default=20,
                        help="rounds of the in-process A/B of mace's and cfmtrain's step")


def run(args: argparse.Namespace) -> int:
    """Run both trainings one after the other and write the comparison."""
    import torch

    cfg = load_config(args.config, [*args.overrides, "variant=baseline", "progress=false",
                                    "measure_straggler=false"])
    threads = args.threads or available_cpus()
    cfg.threads = threads
    work = (args.work_dir or args.output.with_suffix("")).resolve()  # mace runs with cwd=work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    store = GraphStore(args.graphs if len(args.graphs) > 1 else args.graphs[0])
    parts = load_parts(store, args.split, cfg)
    export_extxyz(store, parts["train"], work / "train.xyz")
    export_extxyz(store, parts["valid"], work / "valid.xyz")
    env = subprocess_env(threads)
    r_max = cfg.model.r_max or store.cutoff
    rows = [run_mace(cfg, r_max, work, env), run_cfmtrain(cfg, args.graphs, args.split, work, env)]
    torch.set_num_threads(threads)
    ab = interleaved(cfg, args.graphs, args.split, args.interleaved_rounds)
    rows += [{"tool": f"{name} (paired rounds)", "timed_steps": ab["rounds"],
              "step_s_median": ab[f"{key}_step_s_median"],
              **{k: ab[k] for k in ("ratio_median", "ratio_p10", "ratio_p90", "rounds")}}
             for name, key in (("mace take_step", "mace"), ("cfmtrain train_step", "cfmtrain"))]
    ratio = ab["ratio_median"]
    result = {"dataset": args.dataset or args.graphs[0].resolve().name, "threads": threads,
              "train_graphs": len(parts["train"]), "ratio": ratio,
              "within_10_percent": abs(ratio - 1) <= TOLERANCE, "interleaved": ab,
              "separate_ratio_step_s_mean": rows[1]["step_s_mean"] / rows[0]["step_s_mean"],
              "separate_runs": rows[:2], "config": to_dict(cfg),
              "timing": "batch to device + forward + backward + clip + Adam + EMA per step; data "
                        "loading excluded. `ratio` (cfmtrain/mace) is the median of the "
                        "per-round ratios of paired rounds in one process (a step of each on "
                        "the same graphs, order shuffled: robust to other load on the machine; "
                        "10-90% range in `interleaved`); the separate runs' ratio (mean over "
                        "epochs after the first) is also given"}
    report(rows, args.output.with_suffix(".csv"), "baseline check: step time, mace-torch "
           "against cfmtrain's baseline")
    write_json(args.output, result)
    print(f"cfmtrain/mace step time ratio {ratio:.3f} ({ab['ratio_p10']:.3f}-"
          f"{ab['ratio_p90']:.3f}, 10-90% of {ab['rounds']} paired rounds; within 10%: "
          f"{result['within_10_percent']}); "
          f"separate runs {result['separate_ratio_step_s_mean']:.3f}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m cfmtrain.bench.baseline_check",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
