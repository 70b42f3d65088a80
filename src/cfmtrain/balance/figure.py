"""Figure 12: graphs per rank per step, fixed graph count beside Algorithm 1; each graph is a
rectangle as long as its size, coloured by subset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cfmtrain.atomic import atomic_path
from cfmtrain.balance.plan import Plan


def _panel(ax, plan: Plan, sizes: np.ndarray, subsets: np.ndarray, colours: list, steps: int,
           capacity: float, title: str) -> None:
    num_ranks = plan.num_ranks
    labels = []
    for step in range(min(steps, plan.num_steps)):
        for rank in range(num_ranks):
            y = step * (num_ranks + 1) + rank
            x = 0.0
            for g in plan.bin(step * num_ranks + rank):
                ax.barh(y, sizes[g], left=x, height=0.8, color=colours[subsets[g]],
                        edgecolor="black", linewidth=0.4)
                x += float(sizes[g])
            labels.append((y, f"step {step} · rank {rank}"))
    ax.axvline(capacity, color="crimson", linestyle="--", linewidth=1.2)
    ax.set_yticks([y for y, _ in labels], [text for _, text in labels], fontsize=7)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=10)


def plot_figure12(fixed: Plan, balanced: Plan, sizes: np.ndarray, subsets: np.ndarray,
                  names: list[str], *, capacity: float, unit: str, steps: int, title: str,
                  path: str | Path) -> None:
    """Two panels (fixed count, Algorithm 1) over the first `steps` steps; PNG at `path` and a
    PDF beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    palette = plt.get_cmap("tab10").colors
    colours = [palette[k % len(palette)] for k in range(len(names))]
    rows = steps * (fixed.num_ranks + 1)
    fig, axes = plt.subplots(1, 2, figsize=(13, 1.2 + 0.22 * rows), sharey=False)
    count = len(fixed.bin(0))
    _panel(axes[0], fixed, sizes, subsets, colours, steps, capacity,
           f"Fixed count: {count} graphs per batch (PyTorch DistributedSampler)")
    _panel(axes[1], balanced, sizes, subsets, colours, steps, capacity,
           f"Algorithm 1: bins of {capacity:g} {unit}")
    right = max(ax.get_xlim()[1] for ax in axes)
    for ax in axes:
        ax.set_xlim(0, right)
        ax.set_xlabel(f"work per batch ({unit}; one rectangle per graph)")
    present = sorted(set(np.asarray(subsets).tolist()))
    handles = [Patch(facecolor=colours[k], edgecolor="black", label=names[k]) for k in present]
    handles.append(Line2D([], [], color="crimson", linestyle="--", label=f"capacity {capacity:g}"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8,
               frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path = Path(path)
    for target, fmt in ((path, "png"), (path.with_suffix(".pdf"), "pdf")):
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format=fmt, dpi=150)
    plt.close(fig)
