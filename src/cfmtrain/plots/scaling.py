"""Figures 7, 8 and 10 (strong scaling, speed-up over the baseline, weak scaling), each drawn
from its table: measured cells (cells.py; error bars from the repeats' min and max, contended
cells ringed) or the simulator's rows (simulated.py; the fit's band shaded, marked simulated,
and a statement instead of the headline when the fit does not support it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cfmtrain.plots.cells import EPOCH_TIMES, speedup_range
from cfmtrain.plots.common import (
    CONTENDED_NOTE,
    color,
    contended_handle,
    label,
    mark_contended,
    mark_simulated,
    mark_unsupported,
    ordered,
    plt,
    save,
)
from cfmtrain.plots.simulated import EPOCH_TIMES as SIMULATED
from cfmtrain.plots.simulated import headline, unsupported

MEASURED = EPOCH_TIMES  # a measured table's epoch time (median), min and max; a simulated one's
                        # epoch time and band


def _is_simulated(table: pd.DataFrame) -> bool:
    return SIMULATED[0] in table


def _columns(table: pd.DataFrame) -> tuple[tuple[str, str, str], bool]:
    return (SIMULATED, True) if _is_simulated(table) else (MEASURED, False)


def _spread(ax: plt.Axes, x, mid, low, high, variant: str, simulated: bool) -> None:
    """The line of a variant with its spread: a shaded band (simulated) or error bars."""
    if simulated:
        ax.plot(x, mid, "o-", color=color(variant), label=label(variant))
        ax.fill_between(x, low, high, color=color(variant), alpha=0.2, lw=0)
    else:
        ax.errorbar(x, mid, yerr=[mid - low, high - mid], fmt="o-", capsize=3,
                    color=color(variant), label=label(variant))


def _time_axis(values: pd.Series) -> tuple[float, str]:
    return (60.0, "min") if values.max() > 600 else (1.0, "s")


def _epoch_time_lines(table: pd.DataFrame) -> tuple[plt.Figure, plt.Axes, str, str, float, str,
                                                    dict[str, pd.DataFrame]]:
    """A figure with each variant's per-epoch time against ranks, with its spread; (fig, ax,
    the mid and high columns, the time unit's divisor and name, the variants' rows)."""
    (mid, low, high), simulated = _columns(table)
    div, unit = _time_axis(table[high])
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    lines = {}
    for variant in ordered(table.variant):
        rows = lines[variant] = table[table.variant == variant].sort_values("ranks")
        _spread(ax, rows.ranks, rows[mid] / div, rows[low] / div, rows[high] / div, variant,
                simulated)
    return fig, ax, mid, high, div, unit, lines


def draw_strong_scaling(table: pd.DataFrame, output: str | Path, title: str) -> list[Path]:
    """Fig 7: per-epoch time against ranks, one line per variant, ideal scaling dotted."""
    fig, ax, mid, _, div, unit, lines = _epoch_time_lines(table)
    for variant, rows in lines.items():
        first = rows.iloc[0]
        ideal = first[mid] * first.ranks / rows.ranks / div
        ax.plot(rows.ranks, ideal, ":", color=color(variant), alpha=0.6)
    ax.plot([], [], "k:", label="ideal (linear) scaling")
    _log_ranks(ax, table.ranks)
    ax.set_yscale("log")
    ax.set_ylabel(f"time per epoch ({unit}, log scale)")
    return _finish(fig, ax, table, title, output, mid, div)


def draw_speedup(table: pd.DataFrame, output: str | Path, title: str) -> list[Path]:
    """Fig 8: the baseline's per-epoch time over each variant's, at each rank count."""
    (mid, _, _), simulated = _columns(table)
    if simulated:
        low, high = table.speedup_low, table.speedup_high
    else:
        low, high = speedup_range(table)
    reason = unsupported(table) if simulated else ""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    if not reason:  # a simulated speed-up the fit does not support is not drawn
        for variant in ordered(table.variant):
            at = table.variant == variant
            order = table[at].ranks.argsort().to_numpy()
            rows = table[at].iloc[order]
            _spread(ax, rows.ranks, rows.speedup, low[at].iloc[order], high[at].iloc[order],
                    variant, simulated)
        ax.axhline(1.0, color="k", lw=0.8)
    best = headline(table) if simulated else None
    if best:
        ax.annotate(f"{best['speedup']:.2f}x at {best['ranks']} ranks\n(fit band "
                    f"{best['low']:.2f}-{best['high']:.2f}x)",
                    (best["ranks"], best["speedup"]), textcoords="offset points",
                    xytext=(-6, -14), ha="right", va="top", fontsize=8, weight="bold")
    _log_ranks(ax, table.ranks)
    ax.set_ylabel("speedup over baseline (x, per-epoch time; measured: paired median)")
    return _finish(fig, ax, table, title, output, "speedup", 1.0)


def draw_weak_scaling(table: pd.DataFrame, output: str | Path, title: str) -> list[Path]:
    """Fig 10: per-epoch time as data set size and ranks grow together, one line per variant."""
    fig, ax, mid, high, div, unit, _ = _epoch_time_lines(table)
    for ranks, rows in table.groupby("ranks"):
        ax.annotate(", ".join(sorted(set(rows.dataset))), (ranks, rows[high].max() / div),
                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    _log_ranks(ax, table.ranks)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"time per epoch ({unit})")
    return _finish(fig, ax, table, title, output, mid, div)


def _log_ranks(ax: plt.Axes, ranks: pd.Series) -> None:
    ticks = np.unique(ranks)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks], rotation=45 if len(ticks) > 6 else 0)
    ax.set_xlabel("ranks (GPUs in the paper; CPU processes here), log scale")


def _finish(fig: plt.Figure, ax: plt.Axes, table: pd.DataFrame, title: str,
            output: str | Path, y: str, div: float) -> list[Path]:
    """Title, grid and legend; measured: contended cells ringed; simulated: the banner, and
    the statement when the fit does not support the numbers."""
    simulated = _is_simulated(table)
    ax.set_title(("Simulated: " if simulated else "") + title)
    ax.grid(alpha=0.3, which="both")
    handles, texts = ax.get_legend_handles_labels()
    if not simulated and table.contended.any():
        rows = table[table.contended]
        mark_contended(ax, rows.ranks, rows[y] / div)
        handles.append(contended_handle())
        texts.append(CONTENDED_NOTE)
    if handles:
        ax.legend(handles, texts, fontsize=8)
    if simulated:
        mark_simulated(fig)
        reason = unsupported(table)
        if reason:
            mark_unsupported(ax, reason)
    return save(fig, output)
