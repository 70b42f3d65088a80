"""The figure of `cfmtrain bench md`, drawn from its table (results/bench/md_<preset>.csv): MD
steps per second against atoms, a panel per system."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd

from cfmtrain.atomic import atomic_path
from cfmtrain.plots.common import plt

COLORS = {"fused": "tab:green", "mace": "tab:blue", "symmetrix": "tab:orange"}


def draw_md(table: pd.DataFrame, path: str | Path, shapes: list[str], impls: tuple[str, ...]
            ) -> None:
    """Steps/s against atoms, a panel per system, a line per shape and implementation (dashes
    alternate over every shape and implementation, in the order given)."""
    rows = table.to_dict("records")
    systems = sorted({r["system"] for r in rows})
    fig, axes = plt.subplots(1, len(systems), figsize=(5 * len(systems), 3.8), squeeze=False)
    for ax, system in zip(axes[0], systems, strict=True):
        for (shape, impl), dash in zip(itertools.product(shapes, impls),
                                       itertools.cycle(("-", "--"))):
            pts = sorted((r["atoms"], r["steps_per_s"]) for r in rows if r["system"] == system
                         and r["shape"] == shape and r["impl"] == impl and r["status"] == "ok")
            if pts:
                ax.plot(*zip(*pts, strict=True), dash, marker="o", color=COLORS[impl],
                        alpha=1.0 if shape.endswith("medium") else 0.6, label=f"{shape} {impl}")
        failed = [r for r in rows if r["system"] == system and r["status"] != "ok"]
        for k, r in enumerate(failed):
            ax.annotate(f"{r['shape']} {r['impl']} {r['target_atoms']}: {r['status'][:30]}",
                        (0.02, 0.95 - 0.07 * k), xycoords="axes fraction", fontsize=7,
                        color="tab:red")
        ax.set(xscale="log", yscale="log", xlabel="atoms", ylabel="MD steps/s (1 fs)",
               title=f"{system}: an MD step (energy, forces)")
        ax.grid(alpha=0.3, which="both")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=150, format="png")
    plt.close(fig)
    print(f"wrote {path}")
