"""Figure 9: training loss per epoch, baseline against the optimised variants (epochs.csv)."""

from __future__ import annotations

from pathlib import Path

from cfmtrain.plots.common import color, label, plt, save
from cfmtrain.simulate.runs import load_runs


def loss_curves(paths: list[str | Path], output: str | Path, title: str) -> list[Path]:
    """One line per run: train loss (and validation loss where logged) against epoch."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for run in load_runs(paths):
        epochs = run.epochs()
        name = f"{label(run.variant)}, {run.ranks} rank{'s' * (run.ranks > 1)}"
        ax.plot(epochs.epoch, epochs.train_loss, "o-", color=color(run.variant),
                label=f"{name}: train")
        if "valid_loss" in epochs:
            ax.plot(epochs.epoch, epochs.valid_loss, "s--", color=color(run.variant),
                    alpha=0.7, label=f"{name}: validation")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss (weighted energy + forces, log scale)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, output)
