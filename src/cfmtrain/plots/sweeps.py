"""Figure 11 (time per step against batch size, small and large molecules, float32 and float64)
and the bin-capacity figure of section 5.5, from the sweep CSVs under results/sweep/."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cfmtrain.plots.common import plt, save

BATCH_COLUMNS = ("molecules", "dtype", "graphs", "atoms", "step_s", "status")
CAPACITY_COLUMNS = ("dtype", "capacity", "atoms", "step_s", "atoms_per_s", "status")
STYLE = {"float32": "-", "float64": "--"}


def read_sweep(path: str | Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """A sweep CSV holding `columns`."""
    frame = pd.read_csv(path)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: not a sweep table, missing columns {missing}")
    return frame


def batch_size(path: str | Path, output: str | Path, title: str) -> list[Path]:
    """Fig 11: seconds per training step against graphs per batch; out-of-memory points marked."""
    frame = read_sweep(path, BATCH_COLUMNS)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for (molecules, dtype), rows in frame.groupby(["molecules", "dtype"], sort=True):
        ok = rows[rows.status == "ok"].sort_values("graphs")
        atoms = int(round((ok.atoms / ok.graphs).mean())) if not ok.empty else 0
        line, = ax.plot(ok.graphs, ok.step_s, "o" + STYLE.get(dtype, "-"),
                        label=f"{molecules} molecules (~{atoms} atoms), {dtype}")
        oom = rows[rows.status == "oom"]
        if not oom.empty and not ok.empty:
            ax.plot(oom.graphs, [ok.step_s.max()] * len(oom), "x", ms=10, mew=2,
                    color=line.get_color())
    ax.plot([], [], "kx", label="out of memory")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (graphs per step, log scale)")
    ax.set_ylabel("time per training step (s, log scale)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, output)


def capacity(path: str | Path, output: str | Path, title: str,
             recommended: int | None = None) -> list[Path]:
    """Throughput (atoms per second) against bin capacity per dtype, the recommendation marked."""
    frame = read_sweep(path, CAPACITY_COLUMNS)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for dtype, rows in frame.groupby("dtype"):
        ok = rows[rows.status == "ok"].sort_values("capacity")
        line, = ax.plot(ok.capacity, ok.atoms_per_s, "o" + STYLE.get(dtype, "-"), label=dtype)
        oom = rows[rows.status == "oom"]
        if not oom.empty and not ok.empty:
            ax.plot(oom.capacity, [ok.atoms_per_s.max()] * len(oom), "x", ms=10, mew=2,
                    color=line.get_color())
    ax.plot([], [], "kx", label="out of memory")
    if recommended:
        ax.axvline(recommended, color="tab:green", ls=":", label=f"recommended: {recommended}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bin capacity (atoms per batch, log scale)")
    ax.set_ylabel("training throughput (atoms/s)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, output)
