"""Figure 6: ablation speedup of each variant over the baseline, per data set size (per-epoch time
relative to the fixed-count baseline of the same data set and rank count)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cfmtrain.plots.common import color, label, ordered, plt, save
from cfmtrain.plots.scaling import runs_frame


def ablation(paths: list[str | Path], output: str | Path, title: str) -> list[Path]:
    """Grouped bars: one group per (data set, ranks) in input order, one bar per variant."""
    frame = runs_frame(paths)
    groups = list(dict.fromkeys(zip(frame.dataset, frame.ranks, strict=True)))
    variants = ordered(frame.variant)
    fig, ax = plt.subplots(figsize=(1.2 + 1.6 * len(groups), 4.5))
    width = 0.8 / len(variants)
    for k, variant in enumerate(variants):
        values = []
        for dataset, ranks in groups:
            cell = frame[(frame.dataset == dataset) & (frame.ranks == ranks)]
            base = cell[cell.variant == "baseline"].epoch_s
            if base.empty:
                raise ValueError(f"Figure 6: no baseline run for {dataset} on {ranks} ranks")
            mine = cell[cell.variant == variant].epoch_s
            values.append(base.iloc[0] / mine.iloc[0] if not mine.empty else np.nan)
        x = np.arange(len(groups)) + (k - (len(variants) - 1) / 2) * width
        bars = ax.bar(x, values, width, color=color(variant), label=label(variant))
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylim(0, 1.3 * max(1.0, float(np.nanmax(ax.dataLim.y1))))
    ax.set_xticks(np.arange(len(groups)),
                  [f"{d}\n{r} rank{'s' * (r > 1)}" for d, r in groups])
    ax.set_xlabel("data set (nested subsets, small to large) and ranks")
    ax.set_ylabel("speedup over baseline (x, per-epoch time ratio)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    return save(fig, output)
