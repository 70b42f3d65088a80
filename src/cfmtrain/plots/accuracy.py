"""The time-to-accuracy figure of `cfmtrain bench accuracy`: validation force MAE against training
wall time, one line per run and seed (the paper's Figure 9 against time instead of epochs)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from matplotlib.ticker import ScalarFormatter

from cfmtrain.paper import BASELINE, BOTH
from cfmtrain.plots.common import color, plt, save

LABELS = {BASELINE.name: "cfmtrain baseline (fixed count)",
          BOTH.name: "cfmtrain both (balancer + fused kernels)",
          "mace_run_train": "mace-torch mace_run_train"}
COLORS = {"mace_run_train": "tab:red"}


def draw_accuracy(curve: pd.DataFrame, summary: pd.DataFrame, output: Path, title: str
                  ) -> list[Path]:
    """From the benchmark's tables (accuracy_<name>.csv and _summary.csv): force MAE (log
    scale) against cumulative wall time per run and seed (rows of `curve` and `summary` carry a
    `seed`), the target (mace_run_train's final force MAE; the median over the seeds) as a
    dashed line and each run's time to reach its seed's target as a cross."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    seeds = sorted(summary.seed.unique())
    for run in summary.run.unique():
        for k, seed in enumerate(seeds):
            rows = curve[(curve.run == run) & (curve.seed == seed)].sort_values("epoch")
            ax.plot(rows.wall_s, rows.valid_mae_f_meV_per_A, marker="o", markersize=3,
                    label=LABELS.get(run, run) if k == 0 else None,
                    color=COLORS.get(run, color(run)), alpha=1.0 if len(seeds) == 1 else 0.7)
    targets = summary.groupby("seed").target_mae_f_meV_per_A.first()
    target = float(targets.median())
    what = "final" if len(seeds) == 1 else f"final, median of {len(seeds)} seeds"
    ax.axhline(target, color="black", linestyle="--", linewidth=0.8,
               label=f"target: mace_run_train's {what} ({target:.1f} meV/Å)")
    for row in summary.itertuples():
        if not math.isnan(row.time_to_target_s):
            ax.plot([row.time_to_target_s], [row.target_mae_f_meV_per_A], marker="x",
                    markersize=9, color=COLORS.get(row.run, color(row.run)))
    ax.set(xlabel="training wall time, s (epochs with validation)",
           ylabel="validation force MAE, meV/Å", yscale="log", title=title)
    ax.set_xlim(left=0)
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.tick_params(axis="y", which="both", labelsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="best")
    return save(fig, output)


def draw_time_to_target(summary: pd.DataFrame, output: Path, title: str) -> list[Path]:
    """From the benchmark's overall summary (one row per run, no curve): each run's time to
    mace_run_train's final force MAE as a bar (error bars: its seeds' min and max), its speed-up
    over mace_run_train written on it."""
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    rows = summary.sort_values("time_to_target_s", ascending=False).reset_index(drop=True)
    err = [rows.time_to_target_s - rows.time_to_target_s_min,
           rows.time_to_target_s_max - rows.time_to_target_s]
    bars = ax.barh([LABELS.get(r, r) for r in rows.run], rows.time_to_target_s, xerr=err,
                   color=[COLORS.get(r, color(r)) for r in rows.run], capsize=3)
    ax.bar_label(bars, [f"{s:.0f} s ({x:.2f}x)" for s, x in zip(rows.time_to_target_s,
                                                                 rows.speedup, strict=True)],
                 fontsize=8, padding=3)
    ax.set(xlabel="training wall time to mace_run_train's final force MAE, s", title=title)
    ax.set_xlim(0, 1.3 * float(rows.time_to_target_s_max.max()))
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(axis="x", alpha=0.3)
    return save(fig, output)
