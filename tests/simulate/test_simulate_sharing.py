"""The node-sharing model: hand-computed steps, and its two factors recovered from runs whose
ranks computed by a known law, scale and slowdown."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import write_run

from cfmtrain.simulate.costmodel import CostModel
from cfmtrain.simulate.sharing import fit_sharing, node_step_s
from cfmtrain.train.runs import load_runs

COST = (0.05, 2e-3, 1e-4)
LAW = CostModel("mace", intercept_s=COST[0], per_atom_s=COST[1], per_edge_s=COST[2])


def test_node_step_by_hand():
    # 1 s and 3 s on one node at 1.5x while both compute: 1 * 1.5 + (3 - 1) = 3.5.
    assert node_step_s(np.array([[1.0, 3.0]]), 2, 1.5) == pytest.approx([3.5])
    # A rank a node: the slowest rank alone.
    assert node_step_s(np.array([[1.0, 3.0]]), 1, 1.5) == pytest.approx([3.0])
    # Three on a node at 2x with all three: 1 * 2 + 1 * 1.5 + 1 * 1 = 4.5.
    assert node_step_s(np.array([[3.0, 1.0, 2.0]]), 3, 2.0) == pytest.approx([4.5])
    # Two nodes of two: the slower node's step; an idle rank (0 s) shares nothing.
    step = node_step_s(np.array([[1.0, 3.0, 0.0, 3.2], [2.0, 2.0, 2.0, 2.0]]), 2, 1.5)
    assert step == pytest.approx([3.5, 3.0])
    # No sharing slowdown: the slowest rank.
    assert node_step_s(np.array([[1.0, 3.0, 2.0]]), 3, 1.0) == pytest.approx([3.0])


def _shared(folder, scale: float, slowdown: float) -> None:
    """Rewrite a run's compute times as the node model's with `scale` and `slowdown`: on a
    2-rank step the rank with less work computes alongside the other all along."""
    steps = pd.read_csv(folder / "steps.csv")
    solo = scale * (COST[0] + COST[1] * steps.atoms + COST[2] * steps.edges)
    if steps["rank"].nunique() == 1:
        steps["compute_s"] = solo
    else:
        least = solo.groupby(steps.step).transform("min")
        steps["compute_s"] = least * slowdown + (solo - least)
    steps.to_csv(folder / "steps.csv", index=False)


def test_fit_recovers_scale_and_slowdown(tmp_path):
    one = write_run(tmp_path, "d", "baseline", 1, cost=COST, seed=1)
    two = write_run(tmp_path, "d", "baseline", 2, cost=COST, seed=2)
    _shared(one, 1.2, 1.0)
    _shared(two, 1.2, 1.6)
    fit = fit_sharing(LAW, load_runs([one, two]))
    assert fit["scale"] == pytest.approx(1.2, rel=1e-9)
    assert fit["shared_slowdown"] == pytest.approx(1.6, rel=1e-9)
    assert fit["ranks_per_node"] == 2
    alone = fit_sharing(LAW, load_runs([one]))  # no multi-rank run: no sharing
    assert alone == {"scale": pytest.approx(1.2), "shared_slowdown": 1.0, "ranks_per_node": 1}
