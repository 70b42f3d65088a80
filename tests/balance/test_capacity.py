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
    # brute force on the real packer: within 10% of the baseline, at the boundary between the
    # capacities with more steps than the baseline and those with no more, on its nearer side
    steps = {c: pack_plan(sizes, c, ranks, oversize="own_bin").num_steps
             for c in (cap.value - 1, cap.value, cap.value + 1)}
    assert steps[cap.value] == cap.steps and abs(cap.steps - target) <= 0.1 * target
    if cap.steps <= target:  # the smallest capacity with no more steps, nearer than the one below
        assert steps[cap.value - 1] - target > target - cap.steps
    else:  # the largest with more steps, at least as near as the one above (no more steps)
        assert steps[cap.value + 1] <= target
        assert cap.steps - target <= target - steps[cap.value + 1]
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


def test_auto_capacity_takes_the_nearer_side_of_a_jump():
    # 124 graphs on 2 ranks, 2 per batch, as the default cells' mini_s (ten 768-atom cells, some
    # mid-size, many small molecules): the step count jumps from 32 (capacity 23) to 23 (24)
    # across the baseline's 31; the nearer side keeps 30+ steps, where the smallest capacity
    # with no more steps than the baseline would leave 23
    rng = np.random.default_rng(2)
    n_large, n_mid = rng.integers(2, 12), rng.integers(5, 50)
    sizes = rng.permutation(np.concatenate([np.full(n_large, 768), rng.integers(33, 500, n_mid),
                                            rng.choice([3, 6, 9, 12, 24, 32],
                                                       124 - n_large - n_mid)]))
    cap = auto_capacity(sizes, 2, 2)
    above = pack_plan(sizes, cap.value + 1, 2, oversize="own_bin").num_steps
    assert (cap.baseline_steps, cap.value, cap.steps, above) == (31, 23, 32, 23)
