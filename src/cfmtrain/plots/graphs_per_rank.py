"""Figure 12: graphs per rank per step, PyTorch's fixed graph count beside the paper's
Algorithm 1, from the graph store's per-graph sizes: the table of every graph placed (one
rectangle each, as long as its size), and the two panels drawn from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from cfmtrain.balance.costs import graph_costs
from cfmtrain.balance.strategies import algorithm1, fixed_count
from cfmtrain.paper import CAPACITY
from cfmtrain.plots.common import plt, save

PANELS = ("fixed_count", "algorithm1")


@dataclasses.dataclass(frozen=True)
class Layout:
    """What Figure 12 shows: bins of `capacity` (size measure, a*atoms + b*edges for
    'linear'), `ranks` ranks, the first `steps` steps, `graphs_per_batch` for the fixed count."""

    capacity: float = CAPACITY
    ranks: int = 8
    steps: int = 2
    graphs_per_batch: int = 4
    measure: str = "atoms"
    a: float = 1.0
    b: float = 0.0
    seed: int = 0
    oversize: str = "error"

    @property
    def unit(self) -> str:
        return {"atoms": "atoms", "edges": "edges"}.get(
            self.measure, f"cost {self.a:g}·atoms + {self.b:g}·edges")


def graphs_per_rank_table(graphs: list[str | Path], dataset: str, layout: Layout) -> pd.DataFrame:
    """One row per graph placed in the first `layout.steps` steps: panel (fixed_count or
    algorithm1), step, rank, graph (store index), subset, size, left (start of its rectangle),
    with the panel's capacity and size unit."""
    from cfmtrain.graphs.store import GraphStore  # lazy: h5py, torch; light command

    store = GraphStore(list(graphs), check_edges=False)
    sizes = graph_costs(store.num_atoms, store.num_edges, layout.measure, layout.a, layout.b)
    plans = {"fixed_count": fixed_count(sizes, layout.capacity, layout.ranks, seed=layout.seed,
                                        graphs_per_batch=layout.graphs_per_batch),
             "algorithm1": algorithm1(sizes, layout.capacity, layout.ranks,
                                      oversize=layout.oversize, refine=False)}
    rows = []
    for panel, plan in plans.items():
        for step in range(min(layout.steps, plan.num_steps)):
            for rank in range(plan.num_ranks):
                left = 0.0
                for g in plan.bin(step * plan.num_ranks + rank):
                    rows.append({"panel": panel, "step": step, "rank": rank, "graph": int(g),
                                 "subset": store.subset_names[store.subsets[g]],
                                 "size": float(sizes[g]), "left": left})
                    left += float(sizes[g])
    table = pd.DataFrame(rows).assign(dataset=dataset, capacity=layout.capacity,
                                      unit=layout.unit)
    return table[["dataset", "panel", "step", "rank", "graph", "subset", "size", "left",
                  "capacity", "unit"]]


def draw_graphs_per_rank(table: pd.DataFrame, output: str | Path, title: str) -> list[Path]:
    """Two panels (fixed count, Algorithm 1): a row per (step, rank), a rectangle per graph
    coloured by subset, the capacity dashed."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    palette = plt.get_cmap("tab10").colors
    subsets = list(dict.fromkeys(table.subset))
    colours = {s: palette[k % len(palette)] for k, s in enumerate(subsets)}
    capacity, unit = float(table.capacity.iloc[0]), str(table.unit.iloc[0])
    ranks = int(table["rank"].max()) + 1
    rows = (int(table.step.max()) + 1) * (ranks + 1)
    fig, axes = plt.subplots(1, 2, figsize=(13, 1.2 + 0.22 * rows))
    for ax, panel in zip(axes, PANELS, strict=True):
        part = table[table.panel == panel]
        y = part.step * (ranks + 1) + part["rank"]
        ax.barh(y, part["size"], left=part.left, height=0.8,
                color=[colours[s] for s in part.subset], edgecolor="black", linewidth=0.4)
        ticks = sorted(set(zip(y, part.step, part["rank"], strict=True)))
        ax.set_yticks([t for t, _, _ in ticks], [f"step {s} · rank {r}" for _, s, r in ticks],
                      fontsize=7)
        ax.axvline(capacity, color="crimson", linestyle="--", linewidth=1.2)
        ax.invert_yaxis()
        ax.set_xlabel(f"work per batch ({unit}; one rectangle per graph)")
        first = part[(part.step == 0) & (part["rank"] == 0)]
        ax.set_title(f"Fixed count: {len(first)} graphs per batch (PyTorch DistributedSampler)"
                     if panel == "fixed_count" else f"Algorithm 1: bins of {capacity:g} {unit}",
                     fontsize=10)
    right = max(ax.get_xlim()[1] for ax in axes)
    for ax in axes:
        ax.set_xlim(0, right)
    handles = [Patch(facecolor=colours[s], edgecolor="black", label=s) for s in subsets]
    handles.append(Line2D([], [], color="crimson", linestyle="--", label=f"capacity {capacity:g}"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8,
               frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return save(fig, output)
