"""`cfmtrain figure <name> --inputs FILES --output PNG`: draw one of the paper's figures from
results files (a PDF is written beside the PNG)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from cfmtrain.plots import ablation, loss, scaling, straggler, sweeps


def _one(inputs: list[str], name: str) -> str:
    if len(inputs) != 1:
        raise ValueError(f"figure {name}: expects one input file, got {len(inputs)}")
    return inputs[0]


def _capacity(inputs: list[str], output: str, title: str) -> list[Path]:
    """Capacity figure: the sweep CSV, optionally followed by its recommendation JSON."""
    recommended = None
    if len(inputs) == 2:
        recommended = json.loads(Path(inputs[1]).read_text()).get("recommended_capacity")
    elif len(inputs) != 1:
        raise ValueError(f"figure capacity: expects the sweep CSV [and its JSON], got {inputs}")
    return sweeps.capacity(inputs[0], output, title, recommended)


Figure = Callable[[list[str], str, str], list[Path]]
FIGURES: dict[str, tuple[Figure, str]] = {
    "ablation": (ablation.ablation,
                 "Figure 6: ablation speedup per variant and data set size"),
    "strong-scaling": (lambda i, o, t: scaling.strong_scaling(scaling.runs_frame(i), o, t),
                       "Figure 7: strong scaling (measured)"),
    "speedup": (lambda i, o, t: scaling.speedup(scaling.runs_frame(i), o, t),
                "Figure 8: speedup over baseline MACE (measured)"),
    "loss": (loss.loss_curves, "Figure 9: training loss per epoch, baseline vs optimised"),
    "weak-scaling": (lambda i, o, t: scaling.weak_scaling(scaling.runs_frame(i), o, t),
                     "Figure 10: weak scaling (measured)"),
    "batch-size": (lambda i, o, t: sweeps.batch_size(_one(i, "batch-size"), o, t),
                   "Figure 11: time per step against batch size"),
    "capacity": (_capacity, "Section 5.5: throughput against bin capacity"),
    "straggler": (straggler.straggler,
                  "Figure 13: compute vs straggler wait per rank, fixed count vs balanced"),
    "strong-scaling-simulated": (
        lambda i, o, t: scaling.strong_scaling(
            scaling.simulated_frame(_one(i, "strong-scaling-simulated")), o, t, simulated=True),
        "Figure 7 at the paper's scale: strong scaling"),
    "speedup-simulated": (
        lambda i, o, t: scaling.speedup(
            scaling.simulated_frame(_one(i, "speedup-simulated")), o, t, simulated=True),
        "Figure 8 at the paper's scale: speedup over baseline"),
    "weak-scaling-simulated": (
        lambda i, o, t: scaling.weak_scaling(
            scaling.simulated_frame(_one(i, "weak-scaling-simulated")), o, t, simulated=True),
        "Figure 10 at the paper's scale: weak scaling"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain figure`."""
    parser.add_argument("name", choices=sorted(FIGURES), help="which figure")
    parser.add_argument("--inputs", nargs="+", required=True,
                        help="results files: run folders or summary.json (figures 6-10, 13), a "
                             "sweep CSV (batch-size, capacity), a simulator CSV (*-simulated)")
    parser.add_argument("--output", type=Path, required=True, help="PNG path (PDF beside it)")
    parser.add_argument("--title", help="figure title (default: the paper's figure name)")


def run(args: argparse.Namespace) -> int:
    """Draw the figure; print the files written."""
    draw, default_title = FIGURES[args.name]
    for path in draw(args.inputs, str(args.output), args.title or default_title):
        print(f"wrote {path}")
    return 0
