"""Figure 13: per rank, mean compute time against straggler wait per step, fixed count against
balanced batches, drawn from its table (cells.straggler_table)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cfmtrain.plots.common import label, plt, save

PARTS = (("compute_s", "forward + backward compute", "tab:blue"),
         ("optim_s", "optimiser step", "tab:cyan"),
         ("wait_s", "straggler wait (for the slowest rank)", "tab:red"),
         ("allreduce_s", "gradient all-reduce", "tab:orange"),
         ("data_s", "data wait", "tab:gray"))


def draw_straggler(table: pd.DataFrame, output: str | Path, title: str) -> list[Path]:
    """One panel per run: stacked horizontal bars of mean seconds per step on each rank."""
    runs = list(table.groupby(["dataset", "variant", "ranks"], sort=False))
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 0.5 * int(
        table.ranks.max()) + 2.2), sharex=True, squeeze=False)
    for ax, ((dataset, variant, _), means) in zip(axes[0], runs, strict=True):
        left = np.zeros(len(means))
        for column, text, shade in PARTS:
            ax.barh(means["rank"], means[column], left=left, color=shade, label=text)
            left += means[column].to_numpy()
        share = means.compute_share.iloc[0]
        ax.set_title(f"{label(variant)}\n{dataset}, compute {100 * share:.0f}% of step",
                     fontsize=10)
        ax.set_yticks(means["rank"], [f"rank {r}" for r in means["rank"]])
        ax.set_xlabel("mean time per step (s)")
        ax.grid(axis="x", alpha=0.3)
    handles, texts = axes[0][0].get_legend_handles_labels()
    fig.suptitle(title)
    fig.tight_layout()
    fig.legend(handles, texts, fontsize=8, loc="upper center", ncol=3,
               bbox_to_anchor=(0.5, 0.0))
    return save(fig, output)
