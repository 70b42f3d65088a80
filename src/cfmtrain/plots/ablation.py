"""Figure 6: speed-up of each variant over the baseline, per data set size and rank count,
drawn from its table (cells.speedup_table): bars at the median of the group's paired per-round
ratios, error bars their 10-90% range (for runs without rounds: the repeats' min and max),
contended cells hatched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cfmtrain.plots.cells import speedup_range
from cfmtrain.plots.common import CONTENDED_NOTE, color, contended_handle, label, ordered, plt, save


def draw_ablation(table: pd.DataFrame, output: str | Path, title: str) -> list[Path]:
    """Grouped bars: one group per (data set, ranks) in table order, one bar per variant."""
    groups = list(dict.fromkeys(zip(table.dataset, table.ranks, strict=True)))
    variants = ordered(table.variant)
    low, high = speedup_range(table)
    # at least as wide as its title and the legend of four variants
    fig, ax = plt.subplots(figsize=(max(6.5, 1.2 + 1.6 * len(groups)), 4.5))
    width = 0.8 / len(variants)
    for k, variant in enumerate(variants):
        labelled = False
        for g, (dataset, ranks) in enumerate(groups):
            at = (table.dataset == dataset) & (table.ranks == ranks) & (table.variant == variant)
            if not at.any():
                continue
            row = table[at].iloc[0]
            x = g + (k - (len(variants) - 1) / 2) * width
            err = [[row.speedup - low[at].iloc[0]], [high[at].iloc[0] - row.speedup]]
            bars = ax.bar(x, row.speedup, width, color=color(variant), yerr=err, capsize=3,
                          hatch="//" if row.contended else None, edgecolor="black",
                          linewidth=0.4, label=None if labelled else label(variant))
            labelled = True
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylim(0, 1.3 * max(1.0, float(np.nanmax(high))))
    ax.set_xticks(np.arange(len(groups)),
                  [f"{d}\n{r} rank{'s' * (r > 1)}" for d, r in groups])
    ax.set_xlabel("data set (nested subsets, small to large) and ranks")
    ax.set_ylabel("speedup over baseline (x, median of paired rounds;\nbars: 10-90% range)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    handles, texts = ax.get_legend_handles_labels()
    if table.contended.any():
        handles.append(contended_handle(hatched=True))
        texts.append(CONTENDED_NOTE)
    ax.legend(handles, texts, fontsize=8, loc="upper left", ncol=2)
    return save(fig, output)
