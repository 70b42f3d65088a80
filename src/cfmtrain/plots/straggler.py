"""Figure 13: per rank, mean compute time against straggler wait per step, fixed count against
balanced batches (steps.csv of runs with the same rank count)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cfmtrain.plots.common import label, plt, save
from cfmtrain.simulate.runs import load_runs

PARTS = (("compute_s", "forward + backward compute", "tab:blue"),
         ("optim_s", "optimiser step", "tab:cyan"),
         ("wait_s", "straggler wait (for the slowest rank)", "tab:red"),
         ("allreduce_s", "gradient all-reduce", "tab:orange"),
         ("data_s", "data wait", "tab:gray"))


def straggler(paths: list[str | Path], output: str | Path, title: str,
              skip_first_epoch: bool = True) -> list[Path]:
    """One panel per run: stacked horizontal bars of mean seconds per step on each rank."""
    runs = load_runs(paths)
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 0.5 * max(
        r.ranks for r in runs) + 2.2), sharex=True, squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        steps = run.steps()
        if skip_first_epoch and steps.epoch.nunique() > 1:
            steps = steps[steps.epoch != steps.epoch.min()]
        means = steps.groupby("rank")[[c for c, _, _ in PARTS]].mean().fillna(0.0)
        left = np.zeros(len(means))
        for column, text, shade in PARTS:
            ax.barh(means.index, means[column], left=left, color=shade, label=text)
            left += means[column].to_numpy()
        share = means.compute_s.sum() / left.sum() if left.sum() else float("nan")
        ax.set_title(f"{label(run.variant)}\n{run.dataset}, compute {100 * share:.0f}% of step",
                     fontsize=10)
        ax.set_yticks(means.index, [f"rank {r}" for r in means.index])
        ax.set_xlabel("mean time per step (s)")
        ax.grid(axis="x", alpha=0.3)
    handles, texts = axes[0][0].get_legend_handles_labels()
    fig.suptitle(title)
    fig.tight_layout()
    fig.legend(handles, texts, fontsize=8, loc="upper center", ncol=3,
               bbox_to_anchor=(0.5, 0.0))
    return save(fig, output)
