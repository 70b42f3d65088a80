"""The balancer's automatic capacity: as many optimiser steps as the fixed-count baseline."""

import numpy as np
import pytest

from cfmtrain.balance.pack import pack_plan
from cfmtrain.train.capacity import auto_capacity, baseline_steps, resolve_capacity


def molecules_and_slabs(seed: int = 0) -> np.ndarray:
    """Like the real TiAl + ethanol/methanol union: many small molecules, a few 128-atom cells."""
    rng = np.random.default_rng(seed)
    return rng.permutation(np.concatenate([rng.choice([6, 9], 1500), np.full(4, 128),
                                           rng.integers(2, 40, 120)]))


@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("graphs_per_batch", [4, 8])
def test_auto_capacity_matches_the_baseline_steps(ranks, graphs_per_batch):
    sizes = molecules_and_slabs()
    cap = auto_capacity(sizes, graphs_per_batch, ranks)
    target = -(-len(sizes) // (graphs_per_batch * ranks))
    assert cap.baseline_steps == target == baseline_steps(len(sizes), graphs_per_batch, ranks)
    # brute force on the real packer: within 10% of the baseline, and the smallest such capacity
    steps = pack_plan(sizes, cap.value, ranks, oversize="own_bin").num_steps
    assert steps == cap.steps and 0.9 * target <= steps <= target
    assert pack_plan(sizes, cap.value - 1, ranks, oversize="own_bin").num_steps > target
    # below the 128-atom cells: they sit in bins of their own instead of halving the steps
    assert cap.value < 128
    assert cap.baseline_mean == pytest.approx(graphs_per_batch * sizes.mean())


def test_explicit_capacity_far_above_the_baseline_warns():
    sizes = molecules_and_slabs()
    capacity, warning = resolve_capacity(3072, sizes, 8, 2)
    assert capacity.source == "config" and capacity.value == 3072
    assert capacity.steps < 20 and "batch.capacity 3072" in warning and "auto" in warning
    assert f"{capacity.steps} optimiser steps" in warning
    auto, none = resolve_capacity("auto", sizes, 8, 2)
    assert none is None and auto.source == "auto" and auto.steps > 20 * capacity.steps / 2
    near, quiet = resolve_capacity(auto.value + 1, sizes, 8, 2)
    assert quiet is None and near.steps <= auto.steps
