"""Figure 9: training loss per epoch, baseline against the optimised variants, drawn from its
table (cells.loss_table)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cfmtrain.plots.common import color, label, plt, save


def draw_loss(table: pd.DataFrame, output: str | Path, title: str) -> list[Path]:
    """One line per run: train loss (and validation loss where logged) against epoch."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for (_, variant, ranks), rows in table.groupby(["dataset", "variant", "ranks"],
                                                         sort=False):
        name = f"{label(variant)}, {ranks} rank{'s' * (ranks > 1)}"
        ax.plot(rows.epoch, rows.train_loss, "o-", color=color(variant), label=f"{name}: train")
        if rows.valid_loss.notna().any():
            ax.plot(rows.epoch, rows.valid_loss, "s--", color=color(variant), alpha=0.7,
                    label=f"{name}: validation")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss (weighted energy + forces, log scale)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, output)
