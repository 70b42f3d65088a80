"""The seeded split: stratified by subset (config_type) and by size within each subset."""

import numpy as np
import pytest

from cfmtrain.data.split import split_indices


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
    single = np.flatnonzero(subsets == "single")[0]
    assert single in parts["train"]  # a subset of one graph trains


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
