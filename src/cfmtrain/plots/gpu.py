"""The figure of `cfmtrain bench gpu`, drawn from its table (results/bench/gpu_check.csv): the
equality checks' errors against their tolerances, and the paired speed-ups with their ranges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cfmtrain.atomic import atomic_path
from cfmtrain.plots.common import color, plt


def draw_gpu_check(table: pd.DataFrame, path: str | Path) -> None:
    """Left: each equality check's largest relative error (log scale) and its tolerance; right:
    the cuEquivariance step and each variant's epochs over their references, median and 10-90%
    range of the per-round ratios."""
    checks = table[table["kind"] == "equality"]
    ratios = table[table["kind"] != "equality"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, max(3.5, 0.22 * len(checks) + 1.5)),
                                      gridspec_kw={"width_ratios": (3, 2)})
    y = np.arange(len(checks))
    errors = np.maximum(checks["max_rel_err"].astype(float).to_numpy(), 1e-18)
    passed = checks["ok"].astype(bool).to_numpy()
    left.barh(y, errors, color=np.where(passed, "tab:green", "tab:red"))
    left.scatter(checks["tolerance"].astype(float), y, marker="|", s=120, color="black",
                 label="tolerance")
    left.set(xscale="log", yticks=y, xlabel="largest relative difference from e3nn (float64)")
    left.set_yticklabels(checks["check"], fontsize=6)
    left.invert_yaxis()
    left.legend(fontsize=7, loc="lower right")
    y = np.arange(len(ratios))
    median = ratios["ratio_median"].astype(float).to_numpy()
    spread = np.vstack([median - ratios["ratio_p10"].astype(float).to_numpy(),
                        ratios["ratio_p90"].astype(float).to_numpy() - median])
    colours = [color(c) or "tab:purple" for c in ratios["candidate"]]
    right.barh(y, median, xerr=spread, color=colours, capsize=3)
    right.axvline(1.0, color="black", lw=0.8)
    right.set(yticks=y, xlabel="speed-up over the reference (median, 10-90% of rounds)")
    right.set_yticklabels([f"{c} / {r}" for c, r in zip(ratios["candidate"], ratios["reference"],
                                                         strict=True)], fontsize=7)
    right.invert_yaxis()
    fig.suptitle(f"cuEquivariance against e3nn on {table['device'].iloc[0]} (torch "
                 f"{table['torch'].iloc[0]}, CUDA {table['cuda'].iloc[0] or '-'}, "
                 f"cuequivariance {table['cuequivariance'].iloc[0]})", fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=150, format="png")
    plt.close(fig)
    print(f"wrote {path}")
