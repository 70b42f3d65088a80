"""Figure of `cfmtrain bench kernels`: median time per call against atoms, per op and pass."""

from __future__ import annotations

import itertools
from pathlib import Path

from cfmtrain.atomic import atomic_path

STYLE = {"fused": ("tab:green", "o"), "mace": ("tab:blue", "s"), "compile": ("tab:orange", "^"),
         "fused_compile": ("tab:red", "v")}
DASHES = {("float32", "original"): "-", ("float64", "original"): "--",
          ("float32", "reduced"): ":", ("float64", "reduced"): "-."}


def plot_kernels(rows: list[dict], path: str | Path) -> None:
    """One panel per (op, pass): log-log time vs atoms, a line per implementation and dtype;
    configurations that ran out of memory or failed are marked at the top of their panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
                         and r["dtype"] == dtype and r.get("cg", "original") == cg
                         and r.get("status") == "ok")
            if pts:
                color, marker = STYLE[impl]
                ax.plot(*zip(*pts, strict=True), dash, color=color, marker=marker,
                        label=f"{impl} {dtype}" + (" reduced CG" if cg == "reduced" else ""))
        failed = [r for r in panel if r.get("status") != "ok"]
        for k, r in enumerate(failed):
            status = str(r.get("status")).split(":")[0]
            label = f"{r['impl']} {r['dtype']} {r.get('cg', '')} {r['atoms']}: {status}"
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
