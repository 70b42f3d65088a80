"""A trained model's figures: the parity plot (energy per atom and force components, reference
against predicted, per config_type) from `cfmtrain evaluate`'s parity table, and the learning
curves (losses, validation MAEs and the learning rate per epoch) from the run's epochs.csv."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cfmtrain.plots.common import plt, save

PANELS = (("energy_per_atom", "energy per atom (eV/atom)"), ("force", "force component (eV/Å)"))


def draw_parity(table: pd.DataFrame, output: str | Path, title: str) -> list[Path]:
    """Two panels, reference on x and predicted on y, one colour per config_type, y = x
    dashed; each panel's MAE in its corner (from the points drawn)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    kinds = sorted(table.config_type.astype(str).unique())
    colours = {k: plt.cm.tab10(i % 10) for i, k in enumerate(kinds)}
    for ax, (quantity, name) in zip(axes, PANELS, strict=True):
        rows = table[table.quantity == quantity]
        for kind, part in rows.groupby(rows.config_type.astype(str), sort=True):
            ax.scatter(part.reference, part.predicted, s=6 if quantity == "force" else 14,
                       alpha=0.6, color=colours[kind], label=kind, linewidths=0)
        if len(rows):
            low = float(np.nanmin([rows.reference.min(), rows.predicted.min()]))
            high = float(np.nanmax([rows.reference.max(), rows.predicted.max()]))
            ax.plot([low, high], [low, high], "k--", lw=0.8)
            mae = float((rows.predicted - rows.reference).abs().mean())
            unit = "meV/atom" if quantity == "energy_per_atom" else "meV/Å"
            ax.text(0.03, 0.95, f"MAE {1000 * mae:.3g} {unit}\n{len(rows):,} points",
                    transform=ax.transAxes, va="top", fontsize=9)
        ax.set_xlabel(f"reference {name}")
        ax.set_ylabel(f"predicted {name}")
        ax.grid(alpha=0.3)
    if kinds:
        axes[1].legend(fontsize=8, markerscale=2, title="config_type", title_fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return save(fig, output)


def draw_learning_curves(epochs: pd.DataFrame, output: str | Path, title: str) -> list[Path]:
    """Three panels against the epoch: train and validation loss (log), the validation MAEs of
    energy (meV/atom) and forces (meV/Å), and the learning rate (log; stage two shows as its
    drop)."""
    fig, (loss, mae, lr) = plt.subplots(1, 3, figsize=(13, 4))
    valid = epochs[pd.to_numeric(epochs.valid_loss, errors="coerce").notna()]
    loss.plot(epochs.epoch, epochs.train_loss, "o-", ms=3, label="train")
    loss.plot(valid.epoch, pd.to_numeric(valid.valid_loss), "s-", ms=3, label="validation")
    loss.set_yscale("log")
    loss.set_ylabel("loss (weighted, log scale)")
    loss.legend(fontsize=8)
    energy = mae.plot(valid.epoch, 1000 * pd.to_numeric(valid.valid_mae_energy_per_atom), "o-",
                      ms=3, color="tab:blue", label="energy (meV/atom)")
    mae.set_ylabel("validation MAE, energy (meV/atom)", color="tab:blue")
    forces_ax = mae.twinx()
    forces = forces_ax.plot(valid.epoch, 1000 * pd.to_numeric(valid.valid_mae_forces), "s-",
                            ms=3, color="tab:red", label="forces (meV/Å)")
    forces_ax.set_ylabel("validation MAE, forces (meV/Å)", color="tab:red")
    mae.legend(energy + forces, [h.get_label() for h in energy + forces], fontsize=8)
    lr.plot(epochs.epoch, epochs.lr, "o-", ms=3, color="tab:green")
    lr.set_yscale("log")
    lr.set_ylabel("learning rate (log scale)")
    for ax in (loss, mae, lr):
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(title)
    fig.tight_layout()
    return save(fig, output)
