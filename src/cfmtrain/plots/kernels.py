"""The figure of `cfmtrain bench kernels`, drawn from its table (results/bench/kernels_<preset>
.csv): median time per call against atoms, per op and pass."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd

from cfmtrain.atomic import atomic_path
from cfmtrain.plots.common import plt

STYLE = {"fused": ("tab:green", "o"), "mace": ("tab:blue", "s"), "compile": ("tab:orange", "^"),
         "fused_compile": ("tab:red", "v")}
DASHES = {("float32", "original"): "-", ("float64", "original"): "--",
          ("float32", "reduced"): ":", ("float64", "reduced"): "-."}


def _cg(row: dict) -> str:
    """The row's Clebsch-Gordan basis (a row without one: the original)."""
    cg = row.get("cg")
    return cg if isinstance(cg, str) else "original"


def _count(value) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def draw_kernels(table: pd.DataFrame, path: str | Path) -> None:
    """One panel per (op, pass): log-log time vs atoms, a line per implementation and dtype;
    configurations that ran out of memory or failed are marked at the top of their panel."""
    rows = table.to_dict("records")
    ops = sorted({r["op"] for r in rows})
    passes = [p for p in ("forward", "forward_backward", "train_step")
              if any(r["pass"] == p for r in rows)]
    fig, axes = plt.subplots(len(ops), len(passes), figsize=(4.2 * len(passes), 3.4 * len(ops)),
                             squeeze=False)
    for (i, op), (j, kind) in ((a, b) for a in enumerate(ops) for b in enumerate(passes)):
        ax = axes[i][j]
        panel = [r for r in rows if r["op"] == op and r["pass"] == kind]
        for impl, ((dtype, cg), dash) in itertools.product(STYLE, DASHES.items()):
            pts = sorted((r["atoms"], r["median_s"]) for r in panel if r["impl"] == impl
                         and r["dtype"] == dtype and _cg(r) == cg and r.get("status") == "ok")
            if pts:
                color, marker = STYLE[impl]
                ax.plot(*zip(*pts, strict=True), dash, color=color, marker=marker,
                        label=f"{impl} {dtype}" + (" reduced CG" if cg == "reduced" else ""))
        failed = [r for r in panel if r.get("status") != "ok"]
        for k, r in enumerate(failed):
            status = str(r.get("status")).split(":")[0]
            label = f"{r['impl']} {r['dtype']} {_cg(r)} {_count(r['atoms'])}: {status}"
            ax.annotate(label, (0.02, 0.95 - 0.07 * k),
                        xycoords="axes fraction", fontsize=7, color="tab:red")
        ax.set(xscale="log", yscale="log", title=f"{op}: {kind}", xlabel="atoms",
               ylabel="median s per call")
        ax.grid(alpha=0.3, which="both")
        if ax.lines:
            ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=150, format="png")
    plt.close(fig)
    print(f"wrote {path}")
