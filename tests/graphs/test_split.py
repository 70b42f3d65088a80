"""The seeded split: stratified by subset (config_type) and by size within each subset."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cfmtrain.graphs.split import SplitError, split_indices, strata


def tial_like(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One config_type of 96 small cells and 4 rare large ones, plus a second, smaller type."""
    rng = np.random.default_rng(seed)
    subsets = np.array(["TiAl"] * 100 + ["ethanol"] * 30 + ["single"])
    sizes = np.concatenate([rng.integers(2, 16, 96), np.full(4, 128), np.full(30, 9), [3]])
    order = rng.permutation(len(sizes))
    return subsets[order], sizes[order]


@pytest.mark.parametrize("seed", range(40))
def test_rare_large_graphs_spread_over_the_parts(seed):
    subsets, sizes = tial_like(seed)
    parts = split_indices(subsets, (0.1, 0.1), seed, sizes)
    every = np.concatenate(list(parts.values()))
    assert sorted(every) == list(range(len(sizes)))  # a partition
    large = {p: int((sizes[idx] == 128).sum()) for p, idx in parts.items()}
    assert large["valid"] <= 1 and large["test"] <= 1 and large["train"] >= 2, large
    for name, n in (("TiAl", 100), ("ethanol", 30)):  # each subset in proportion
        counts = {p: int((subsets[idx] == name).sum()) for p, idx in parts.items()}
        assert abs(counts["valid"] - 0.1 * n) <= 1 and abs(counts["test"] - 0.1 * n) <= 1
    # a subset too small to give each part a graph joins the pooled remainder (here alone):
    # valid and test take 0.1 of it, i.e. 0 or 1 graph
    single = np.flatnonzero(subsets == "single")[0]
    assert sum(single in idx for idx in parts.values()) == 1


def test_split_is_seeded_and_sizes_are_optional():
    subsets, sizes = tial_like(3)
    a, b = (split_indices(subsets, (0.2, 0.1), 7, sizes) for _ in range(2))
    assert all(np.array_equal(a[p], b[p]) for p in a)
    c = split_indices(subsets, (0.2, 0.1), 8, sizes)
    assert not np.array_equal(a["valid"], c["valid"])
    plain = split_indices(subsets, (0.2, 0.1), 7)
    assert sum(map(len, plain.values())) == len(subsets)
    small = split_indices(np.array(["a"] * 3), (0.05, 0.05), 0, np.arange(3))
    assert len(small["valid"]) == len(small["test"]) == 1


@pytest.mark.parametrize("fractions", [(0.5, 0.5), (0.7, 0.4), (-0.1, 0.2)])
def test_bad_fractions_are_refused(fractions):
    with pytest.raises(ValueError, match="sum to less than 1"):
        split_indices(np.array(["a"] * 5), fractions, 0)


def _within_one_graph_per_stratum(subsets, parts, fractions):
    """Each stratum's valid and test counts are within one graph of the requested share."""
    part_of = np.zeros(len(subsets), int)
    part_of[parts["valid"]], part_of[parts["test"]] = 1, 2
    for _, members in strata(subsets, fractions):
        for k, fraction in ((1, fractions[0]), (2, fractions[1])):
            assert abs((part_of[members] == k).sum() - fraction * len(members)) <= 1


@pytest.mark.parametrize("seed", range(10))
def test_every_config_type_with_one_frame_still_fills_valid_and_test(seed):
    """Forty config_types of one frame each: pooled, then split as one stratum (no longer all
    training with null validation and test MAEs)."""
    subsets = np.array([f"type{k}" for k in range(40)])
    parts = split_indices(subsets, (0.1, 0.1), seed, np.arange(40))
    assert {len(parts["valid"]), len(parts["test"])} <= {4}
    _within_one_graph_per_stratum(subsets, parts, (0.1, 0.1))


@pytest.mark.parametrize("seed", range(10))
def test_a_few_frames_per_type_do_not_inflate_the_fractions(seed):
    """Nine config_types of four frames (0.1 x 4 < 1 each): pooled, so valid and test get about
    10% of the 36 graphs, not one graph per type (25% each)."""
    subsets = np.repeat([f"t{k}" for k in range(9)], 4)
    parts = split_indices(subsets, (0.1, 0.1), seed, np.tile(np.arange(4), 9))
    assert 3 <= len(parts["valid"]) <= 4 and 3 <= len(parts["test"]) <= 4
    _within_one_graph_per_stratum(subsets, parts, (0.1, 0.1))


@pytest.mark.parametrize("n", [3, 4, 5])
def test_three_graphs_give_every_requested_part_one(n):
    for seed in range(20):
        parts = split_indices(np.array(["a", "b", "c", "d", "e"][:n]), (0.05, 0.02), seed)
        assert all(len(parts[p]) >= 1 for p in ("train", "valid", "test")), parts


def test_fewer_than_three_graphs_are_refused_unless_nothing_is_held_out():
    with pytest.raises(SplitError, match="2 graph.*3 are needed"):
        split_indices(np.array(["a", "a"]), (0.1, 0.0), 0)
    parts = split_indices(np.array(["a", "a"]), (0.0, 0.0), 0)
    assert list(parts["train"]) == [0, 1] and not len(parts["valid"]) + len(parts["test"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=3, max_size=300), st.floats(0, 0.45),
       st.floats(0, 0.45), st.integers(0, 2**31))
def test_any_split_is_a_partition_within_one_graph_of_the_request(types, valid, test, seed):
    subsets = np.array([f"t{t}" for t in types])
    parts = split_indices(subsets, (valid, test), seed)
    assert sorted(np.concatenate(list(parts.values()))) == list(range(len(types)))
    for part, fraction in (("valid", valid), ("test", test)):
        assert (len(parts[part]) >= 1) == (fraction > 0)
    _within_one_graph_per_stratum(subsets, parts, (valid, test))


@pytest.mark.parametrize("fractions", [(float("nan"), 0.1), (0.1, float("inf"))])
def test_non_finite_fractions_are_refused(fractions):
    with pytest.raises(SplitError, match="must be finite"):
        split_indices(np.array(["a"] * 5), fractions, 0)
