"""`cfmtrain bench gpu` (`make gpu-check`): one command that checks a GPU node, in a few minutes.

1. cuEquivariance equals mace-torch's e3nn code on the device, for both paper kernels on the
   tests' shapes and for whole models (energies, forces, stress, parameter gradients), in
   float64 (bench/gpu_equality.py); any miss makes the command exit 1;
2. the paper model's training step at 800 atoms, e3nn against both kernels on cuEquivariance,
   in paired rounds (bench/gpu_timing.py);
3. the four variants trained on a small `mini` for two epochs each, in paired rounds
   (bench/gpu_training.py).
It writes results/bench/gpu_check.csv (the device, torch, CUDA and cuEquivariance versions on
every row; each check's error or each ratio with its 10-90% range) and a figure. Without a GPU
it runs the equality checks through cuEquivariance's PyTorch fallback on the shapes that build
quickly there, says "no GPU: device parts skipped" and exits 0; `--device cpu
--force-device-parts` runs every part on the CPU (its test).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys
from pathlib import Path

import torch

from cfmtrain.bench.gpu_equality import equality_rows
from cfmtrain.bench.gpu_timing import step_rows
from cfmtrain.bench.gpu_training import training_rows
from cfmtrain.bench.kernels_worker import MODELS
from cfmtrain.bench.table import report

SKIPPED = "no GPU: device parts skipped"
COLUMNS = ("device", "torch", "cuda", "cuequivariance", "cuequivariance_ops", "kind", "check",
           "max_rel_err", "tolerance", "ok", "reference", "candidate", "reference_s",
           "candidate_s", "ratio_median", "ratio_p10", "ratio_p90", "rounds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The device, the sizes of each part and the outputs."""
    parser.add_argument("--device", help="torch device (default: cuda if there is one, else "
                                         "cpu)")
    parser.add_argument("--force-device-parts", action="store_true",
                        help="time and train on the device even if it is the CPU")
    parser.add_argument("--model", choices=("paper", "tiny"), default="paper",
                        help="model of the equality check, the step and the trainings: the "
                             "paper's size, or a tiny one (tests; without a GPU: tiny)")
    parser.add_argument("--atoms", type=int, default=800, help="atoms of the timed step")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="precision of the timed step and the trainings")
    parser.add_argument("--rounds", type=int, default=15, help="paired rounds of the step")
    parser.add_argument("--epochs", type=int, default=2,
                        help="epochs of each variant: the first is the warm-up round")
    parser.add_argument("--scale", type=float, default=1.0, help="size of mini (1: ~1k graphs)")
    parser.add_argument("--graphs", type=Path, help="train on this store instead of mini")
    parser.add_argument("--split", type=Path, help="the split of --graphs")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="a training config key, e.g. "
                                                  "batch.graphs_per_batch=16")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rounds and of mini")
    parser.add_argument("--work", type=Path, default=Path("results/bench/gpu_check"),
                        help="folder of the mini store and the trainings")
    parser.add_argument("--output", type=Path, default=Path("results/bench/gpu_check.csv"))
    parser.add_argument("--figure", type=Path,
                        default=Path("results/figures/fig_gpu_check.png"))


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def facts(device: torch.device) -> dict[str, str]:
    """What every row carries: the device, torch, CUDA and cuEquivariance versions."""
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else platform.processor() or platform.machine())
    ops = [f"{p} {_version(p)}" for p in ("cuequivariance-ops-torch-cu12",
                                           "cuequivariance-ops-torch-cu13") if _version(p)]
    return {"device": f"{device.type}: {name}", "torch": torch.__version__,
            "cuda": torch.version.cuda or "", "cuequivariance": _version("cuequivariance-torch"),
            "cuequivariance_ops": ", ".join(ops)}


def run(args: argparse.Namespace) -> int:
    """Every part the device allows; the CSV, the figure; 1 if an equality check failed."""
    from cfmtrain.train.cli import quiet_warnings

    quiet_warnings()
    if (args.graphs is None) != (args.split is None):
        print("cfmtrain bench gpu: --graphs and --split go together", file=sys.stderr)
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    device_parts = device.type == "cuda" or args.force_device_parts
    size = args.model if device.type == "cuda" or args.force_device_parts else "tiny"
    print(f"bench gpu on {device} ({facts(device)['device']})", flush=True)
    rows = equality_rows(device, full=device.type == "cuda", size=size,
                         atoms=64 if device.type == "cuda" else 16)
    dtype = getattr(torch, args.dtype)
    if device_parts:
        rows += step_rows(device, size, args.atoms, dtype, args.rounds, args.seed)
        model = [f"model.{key}={value}" for key, value in MODELS[size].items()]
        rows += training_rows(device, args.work, args.scale, args.epochs,
                              [*model, f"model.dtype={args.dtype}", *args.overrides], args.seed,
                              None if args.graphs is None else (args.graphs, args.split))
    common = facts(device)
    table = report([{c: {**common, **r}.get(c) for c in COLUMNS} for r in rows], args.output,
                   f"bench gpu on {common['device']}: cuEquivariance against e3nn")
    if device_parts:
        from cfmtrain.plots.gpu import draw_gpu_check  # lazy: matplotlib

        draw_gpu_check(table, args.figure)
    failed = [r["check"] for r in rows if r["kind"] == "equality" and not r["ok"]]
    if failed:
        print(f"cuEquivariance differs from e3nn in {len(failed)} check(s): "
              + "; ".join(failed), file=sys.stderr)
        return 1
    if not device_parts:
        print(SKIPPED)
    return 0
