"""Figure 5: atoms and edges per graph by subset, from the graph store's per-graph table (no
arrays read): the table of every graph, and the box plots drawn from it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cfmtrain.paper import CUTOFF
from cfmtrain.plots.common import plt, save


def sizes_table(graphs: list[str | Path], dataset: str) -> pd.DataFrame:
    """One row per graph (store index): data set, subset, atoms, edges; subsets in the store's
    order."""
    from cfmtrain.graphs.store import GraphStore  # lazy: h5py, torch; light command

    store = GraphStore(list(graphs), check_edges=False)
    names = np.asarray(store.subset_names, dtype=object)
    order = np.argsort(store.subsets, kind="stable")
    return pd.DataFrame({"dataset": dataset, "subset": names[store.subsets[order]],
                         "graph": order, "atoms": store.num_atoms[order],
                         "edges": store.num_edges[order]})


def draw_sizes(table: pd.DataFrame, output: str | Path, title: str) -> list[Path]:
    """Atoms and edges per graph, one box per subset (whiskers min to max) and one dot per
    graph, log scale."""
    subsets = list(dict.fromkeys(table.subset))
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(subsets) + 2), sharey=True)
    for ax, column, text in ((axes[0], "atoms", "atoms per graph"),
                             (axes[1], "edges", f"edges per graph ({CUTOFF:g} Å cutoff)")):
        data = [table[column][table.subset == s].to_numpy() for s in subsets]
        ax.boxplot(data, orientation="horizontal", whis=(0, 100), widths=0.6)
        for row, d in enumerate(data, start=1):
            jitter = np.random.default_rng(row).uniform(-0.2, 0.2, len(d))
            dots = ax.scatter(d, row + jitter, s=4, alpha=0.35)
        ax.set_xscale("log")
        ax.set_xlabel(f"{text} (count, log scale)")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(1, len(subsets) + 1), subsets)
    axes[0].set_ylabel("subset")
    axes[0].legend([dots], ["graphs (one dot each)"], loc="lower right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return save(fig, output)
