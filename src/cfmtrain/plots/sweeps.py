"""Figure 11 (time per step against batch size, small and large molecules, float32 and float64)
and the bin-capacity figure of section 5.5: their tables from the sweep CSVs under
results/sweep/, and the figures drawn from those tables."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from cfmtrain.plots.common import plt, save
from cfmtrain.sweep.batch import BatchPoint
from cfmtrain.sweep.capacity import CapacityPoint
from cfmtrain.tables import read_table

B, C = BatchPoint.col, CapacityPoint.col
BATCH_COLUMNS = (B.molecules, B.dtype, B.graphs, B.atoms, B.step_s, B.status)
CAPACITY_COLUMNS = (C.dtype, C.capacity, C.atoms, C.step_s, C.atoms_per_s, C.status)
STYLE = {"float32": "-", "float64": "--"}


def batch_size_table(path: str | Path) -> pd.DataFrame:
    """Figure 11: one row per (molecules, dtype, graphs per batch) of the batch-size sweep."""
    return read_table(path, BatchPoint, empty_ok=True)[list(BATCH_COLUMNS)]


def capacity_table(path: str | Path, recommendation: str | Path | None = None) -> pd.DataFrame:
    """Section 5.5: one row per (dtype, capacity) of the capacity sweep, `recommended` true on
    the capacity of the sweep's recommendation JSON (if given)."""
    table = read_table(path, CapacityPoint, empty_ok=True)[list(CAPACITY_COLUMNS)]
    recommended = None
    if recommendation is not None:
        try:
            recommended = json.loads(Path(recommendation).read_text())["recommended_capacity"]
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"{recommendation}: no recommended_capacity ({err})") from None
    return table.assign(recommended=table.capacity == recommended)


def _oom_marks(ax: plt.Axes, rows: pd.DataFrame, x: str, y: str, colour: str) -> None:
    """Out-of-memory points as crosses at the top of their series (they have no time)."""
    ok, oom = rows[rows.status == "ok"], rows[rows.status == "oom"]
    if not oom.empty and not ok.empty:
        ax.plot(oom[x], [ok[y].max()] * len(oom), "x", ms=10, mew=2, color=colour)


def draw_batch_size(table: pd.DataFrame, output: str | Path, title: str) -> list[Path]:
    """Fig 11: seconds per training step against graphs per batch; out-of-memory points marked."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for (molecules, dtype), rows in table.groupby([B.molecules, B.dtype], sort=True):
        ok = rows[rows.status == "ok"].sort_values(B.graphs)
        atoms = int(round((ok.atoms / ok.graphs).mean())) if not ok.empty else 0
        line, = ax.plot(ok.graphs, ok.step_s, "o" + STYLE.get(dtype, "-"),
                        label=f"{molecules} molecules (~{atoms} atoms), {dtype}")
        _oom_marks(ax, rows, B.graphs, B.step_s, line.get_color())
    ax.plot([], [], "kx", label="out of memory")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (graphs per step, log scale)")
    ax.set_ylabel("time per training step (s, log scale)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, output)


def draw_capacity(table: pd.DataFrame, output: str | Path, title: str) -> list[Path]:
    """Throughput (atoms per second) against bin capacity per dtype, the recommendation marked."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for dtype, rows in table.groupby(C.dtype):
        ok = rows[rows.status == "ok"].sort_values(C.capacity)
        line, = ax.plot(ok.capacity, ok.atoms_per_s, "o" + STYLE.get(dtype, "-"), label=dtype)
        _oom_marks(ax, rows, C.capacity, C.atoms_per_s, line.get_color())
    ax.plot([], [], "kx", label="out of memory")
    for capacity in sorted(set(table.capacity[table.recommended])):
        ax.axvline(capacity, color="tab:green", ls=":", label=f"recommended: {capacity}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bin capacity (atoms per batch, log scale)")
    ax.set_ylabel("training throughput (atoms/s)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, output)
