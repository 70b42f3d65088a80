"""Figures 7, 8 and 10: strong scaling, speedup over the baseline, and weak scaling, from measured
runs (summary.json) or from the simulator's tables (marked simulated).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cfmtrain.plots.common import color, label, mark_simulated, ordered, plt, save
from cfmtrain.simulate.runs import load_runs


def runs_frame(paths: list[str | Path]) -> pd.DataFrame:
    """Measured runs as rows: dataset, variant, ranks, epoch_s."""
    return pd.DataFrame([{"dataset": r.dataset, "variant": r.variant, "ranks": r.ranks,
                          "epoch_s": r.epoch_time_s} for r in load_runs(paths)])


def simulated_frame(path: str | Path) -> pd.DataFrame:
    """A simulator table (results/simulate/.../strong.csv or weak.csv) keyed like runs_frame."""
    frame = pd.read_csv(path)
    missing = {"variant", "ranks", "epoch_s"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: not a simulator table, missing columns {sorted(missing)}")
    if "run" in frame and "strategy" in frame:
        frame = frame[frame.run == frame.variant]  # the variants' own pairing, not the extras
    return frame.assign(dataset=frame.get("dataset", "simulated"))


def _time_axis(frame: pd.DataFrame) -> tuple[float, str]:
    return (60.0, "min") if frame.epoch_s.max() > 600 else (1.0, "s")


def strong_scaling(frame: pd.DataFrame, output: str | Path, title: str,
                   simulated: bool = False) -> list[Path]:
    """Fig 7: per-epoch time against ranks, one line per variant, with ideal scaling dashed."""
    div, unit = _time_axis(frame)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for variant in ordered(frame.variant):
        rows = frame[frame.variant == variant].sort_values("ranks")
        ax.plot(rows.ranks, rows.epoch_s / div, "o-", color=color(variant), label=label(variant))
        first = rows.iloc[0]
        ideal = first.epoch_s * first.ranks / rows.ranks / div
        ax.plot(rows.ranks, ideal, ":", color=color(variant), alpha=0.6)
    ax.plot([], [], "k:", label="ideal (linear) scaling")
    _log_ranks(ax, frame.ranks)
    ax.set_yscale("log")
    ax.set_ylabel(f"time per epoch ({unit}, log scale)")
    return _finish(fig, ax, title, output, simulated)


def speedup(frame: pd.DataFrame, output: str | Path, title: str,
            simulated: bool = False) -> list[Path]:
    """Fig 8: per-epoch time of the baseline over each variant's, at each rank count."""
    base = frame[frame.variant == "baseline"].set_index("ranks").epoch_s
    if base.empty:
        raise ValueError(f"{title}: no baseline runs to compare against")
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for variant in ordered(frame.variant):
        rows = frame[(frame.variant == variant) & frame.ranks.isin(base.index)]
        rows = rows.sort_values("ranks")
        ax.plot(rows.ranks, base.loc[rows.ranks].to_numpy() / rows.epoch_s, "o-",
                color=color(variant), label=label(variant))
    ax.axhline(1.0, color="k", lw=0.8)
    _log_ranks(ax, frame.ranks)
    ax.set_ylabel("speedup over baseline (x, per-epoch time ratio)")
    return _finish(fig, ax, title, output, simulated)


def weak_scaling(frame: pd.DataFrame, output: str | Path, title: str,
                 simulated: bool = False) -> list[Path]:
    """Fig 10: per-epoch time as data set size and ranks grow together, one line per variant."""
    div, unit = _time_axis(frame)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for variant in ordered(frame.variant):
        rows = frame[frame.variant == variant].sort_values("ranks")
        ax.plot(rows.ranks, rows.epoch_s / div, "o-", color=color(variant), label=label(variant))
    for ranks, rows in frame.groupby("ranks"):
        ax.annotate(", ".join(sorted(set(rows.dataset))), (ranks, rows.epoch_s.max() / div),
                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    _log_ranks(ax, frame.ranks)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"time per epoch ({unit})")
    return _finish(fig, ax, title, output, simulated)


def _log_ranks(ax: plt.Axes, ranks: pd.Series) -> None:
    ticks = np.unique(ranks)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks], rotation=45 if len(ticks) > 6 else 0)
    ax.set_xlabel("ranks (GPUs in the paper; CPU processes here), log scale")


def _finish(fig: plt.Figure, ax: plt.Axes, title: str, output: str | Path,
            simulated: bool) -> list[Path]:
    ax.set_title(("Simulated: " if simulated else "") + title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    if simulated:
        mark_simulated(fig)
    return save(fig, output)
