"""`cfmtrain figure <name> --inputs FILES --output PNG`: one of the paper's figures from results
files. The figure's tidy table is written first, beside the image (same name, .csv), and the
figure is drawn from that table alone (a PDF beside the PNG). Names are those of the files:
`fig06_ablation` writes results/figures/fig06_ablation.{csv,png,pdf}."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from cfmtrain.atomic import atomic_path
from cfmtrain.balance.costs import MEASURES
from cfmtrain.plots import (
    ablation,
    cells,
    graphs_per_rank,
    loss,
    scaling,
    simulated,
    sizes,
    straggler,
    sweeps,
)


def _one(inputs: list[str], name: str) -> str:
    if len(inputs) != 1:
        raise ValueError(f"figure {name}: expects one input file, got {len(inputs)}")
    return inputs[0]


def _capacity(inputs: list[str], args: argparse.Namespace) -> pd.DataFrame:
    """The capacity sweep's CSV, optionally followed by its recommendation JSON."""
    if len(inputs) not in (1, 2):
        raise ValueError(f"figure fig11_capacity: expects the sweep CSV [and its JSON], "
                         f"got {inputs}")
    return sweeps.capacity_table(*inputs)


def _dataset(args: argparse.Namespace, name: str) -> str:
    if not args.dataset:
        raise ValueError(f"figure {name}: give the data set's name (--dataset)")
    return args.dataset


def _layout(args: argparse.Namespace) -> graphs_per_rank.Layout:
    return graphs_per_rank.Layout(args.capacity, args.ranks, args.steps, args.graphs_per_batch,
                                  args.measure, args.a, args.b, args.seed, args.oversize)


Table = Callable[[list[str], argparse.Namespace], pd.DataFrame]
Draw = Callable[[pd.DataFrame, str | Path, str], list[Path]]


@dataclasses.dataclass(frozen=True)
class Figure:
    """How a figure's table is made from its inputs, how it is drawn, its default title
    (`{dataset}` filled from --dataset)."""

    table: Table
    draw: Draw
    title: str


def _simulated(name: str, tidy: Callable[[pd.DataFrame], pd.DataFrame]) -> Table:
    return lambda inputs, args: tidy(simulated.read_simulated(_one(inputs, name)))


FIGURES: dict[str, Figure] = {
    "fig05_sizes": Figure(
        lambda i, a: sizes.sizes_table(i, _dataset(a, "fig05_sizes")), sizes.draw_sizes,
        "Figure 5: graph sizes of `{dataset}` by subset"),
    "fig06_ablation": Figure(
        lambda i, a: cells.speedup_table(*cells.read_inputs(i), figure="Figure 6"),
        ablation.draw_ablation, "Figure 6: ablation speedup per variant and data set size"),
    "fig07_strong_scaling": Figure(
        lambda i, a: cells.strong_scaling_table(*cells.read_inputs(i)),
        scaling.draw_strong_scaling, "Figure 7: strong scaling (measured)"),
    "fig08_speedup": Figure(
        lambda i, a: cells.speedup_table(*cells.read_inputs(i), figure="Figure 8"),
        scaling.draw_speedup, "Figure 8: speedup over baseline MACE (measured)"),
    "fig09_loss": Figure(
        lambda i, a: cells.loss_table(i), loss.draw_loss,
        "Figure 9: training loss per epoch, baseline vs optimised"),
    "fig10_weak_scaling": Figure(
        lambda i, a: cells.weak_scaling_table(*cells.read_inputs(i)),
        scaling.draw_weak_scaling, "Figure 10: weak scaling (measured)"),
    "fig11_batch_size": Figure(
        lambda i, a: sweeps.batch_size_table(_one(i, "fig11_batch_size")),
        sweeps.draw_batch_size, "Figure 11: time per step against batch size"),
    "fig11_capacity": Figure(
        _capacity, sweeps.draw_capacity, "Section 5.5: throughput against bin capacity"),
    "fig12_graphs_per_rank": Figure(
        lambda i, a: graphs_per_rank.graphs_per_rank_table(
            i, _dataset(a, "fig12_graphs_per_rank"), _layout(a)),
        graphs_per_rank.draw_graphs_per_rank,
        "Figure 12 ({dataset}): graphs per rank per step"),
    "fig13_straggler": Figure(
        lambda i, a: cells.straggler_table(i), straggler.draw_straggler,
        "Figure 13: compute vs straggler wait per rank, fixed count vs balanced"),
    "fig07_strong_scaling_simulated": Figure(
        _simulated("fig07_strong_scaling_simulated", simulated.simulated_strong_table),
        scaling.draw_strong_scaling, "Figure 7 at the paper's scale: strong scaling"),
    "fig08_speedup_simulated": Figure(
        _simulated("fig08_speedup_simulated", simulated.simulated_speedup_table),
        scaling.draw_speedup, "Figure 8 at the paper's scale: speedup over baseline"),
    "fig10_weak_scaling_simulated": Figure(
        _simulated("fig10_weak_scaling_simulated", simulated.simulated_weak_table),
        scaling.draw_weak_scaling, "Figure 10 at the paper's scale: weak scaling"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain figure`."""
    parser.add_argument("name", choices=list(FIGURES), help="which figure")
    parser.add_argument("--inputs", nargs="+", required=True,
                        help="results files: graph shards (fig05, fig12), training runs' "
                             "folders or summary.json (fig06-fig10, fig13) with their groups' "
                             "paired.csv (fig06-fig08, fig10), a sweep CSV "
                             "(fig11_*; fig11_capacity also its JSON), a simulator CSV "
                             "(*_simulated)")
    parser.add_argument("--output", type=Path, required=True,
                        help="PNG path; the table is written beside it (.csv), and a PDF")
    parser.add_argument("--title", help="figure title (default: the paper's figure name)")
    parser.add_argument("--dataset", default="", help="data set name (fig05, fig12: required)")
    layout = graphs_per_rank.Layout()
    group = parser.add_argument_group("fig12_graphs_per_rank")
    group.add_argument("--capacity", type=float, default=layout.capacity, help="bin capacity")
    group.add_argument("--ranks", type=int, default=layout.ranks, help="ranks drawn")
    group.add_argument("--steps", type=int, default=layout.steps, help="steps drawn")
    group.add_argument("--graphs-per-batch", type=int, default=layout.graphs_per_batch,
                       help="graphs per batch of the fixed-count panel (paper: 4)")
    group.add_argument("--measure", choices=MEASURES,
                       default=layout.measure, help="graph size")
    group.add_argument("--a", type=float, default=layout.a, help="linear cost: per atom")
    group.add_argument("--b", type=float, default=layout.b, help="linear cost: per edge")
    group.add_argument("--seed", type=int, default=layout.seed, help="fixed-count shuffling")
    group.add_argument("--oversize", choices=("error", "own_bin"), default=layout.oversize,
                       help="graphs above the capacity: fail, or a bin of their own")


def run(args: argparse.Namespace) -> int:
    """Write the figure's table, then draw the figure from it; print the files written."""
    figure = FIGURES[args.name]
    if args.output.suffix != ".png":
        raise SystemExit(f"cfmtrain figure: {args.output}: the output must end in .png")
    table = figure.table(args.inputs, args)
    csv = args.output.with_suffix(".csv")
    with atomic_path(csv) as tmp:
        table.to_csv(tmp, index=False)
    print(f"wrote {csv}")
    title = args.title or figure.title.format(dataset=args.dataset)
    for path in figure.draw(table, args.output, title):
        print(f"wrote {path}")
    return 0
