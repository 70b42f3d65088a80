"""The figure of `cfmtrain bench scale`, drawn from its table (results/bench/scale.csv): each
stage's time, and memory, against the graph count."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from cfmtrain.atomic import atomic_path
from cfmtrain.plots.common import plt


def draw_scale(table: pd.DataFrame, path: str | Path, stages: tuple[str, ...]) -> None:
    """Two log-log panels: seconds per stage (of `stages`, in that order), and peak RSS /
    summed PSS, against graphs."""
    rows = table.to_dict("records")
    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for stage in stages:
        pts = sorted((r["graphs"], r["seconds"]) for r in rows
                     if r["stage"] == stage and r["seconds"] > 0)
        if pts:
            time_ax.plot(*zip(*pts, strict=True), marker="o", label=stage)
    for stage, column, label in (("graphs", "peak_rss_gb", "graph job, peak RSS"),
                                 ("steps", "peak_rss_gb", "training rank, peak RSS"),
                                 ("steps", "pss_gb_all_ranks", "training ranks, summed PSS")):
        pts = sorted((r["graphs"], r[column]) for r in rows
                     if r["stage"] == stage and not math.isnan(r[column]))
        if pts:
            memory_ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    for ax, ylabel in ((time_ax, "seconds"), (memory_ax, "GB")):
        ax.set(xscale="log", yscale="log", xlabel="graphs", ylabel=ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    time_ax.set_title("time per stage")
    memory_ax.set_title("memory")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
