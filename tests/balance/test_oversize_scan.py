"""The compiled partner scan of the oversize graphs' steps equals the greedy scan written
plainly in Python (the reference), on random pools, sizes and rank counts."""

import numpy as np
import pytest

from cfmtrain import _balance
from cfmtrain.balance.pack import OVERSIZE_FILL


def reference(cumulative, big_sizes, num_ranks, fill):
    placed, ends, taken = [], [], 0
    for size in big_sizes:
        run, end = [], taken
        for _ in range(num_ranks - 1):
            before = cumulative[end - 1] if end else 0
            stop = int(np.searchsorted(cumulative, before + size, side="right"))
            if stop == end or cumulative[stop - 1] - before < fill * size:
                break
            run.append(stop)
            end = stop
        placed.append(len(run) == num_ranks - 1)
        if placed[-1]:
            ends += run
            taken = end
    return np.array(placed), np.array(ends, np.int64)


@pytest.mark.parametrize("kind", ["i64", "f64"])
def test_compiled_scan_equals_the_python_reference(kind):
    rng = np.random.default_rng(5)
    scan = getattr(_balance, f"oversize_partners_{kind}")
    for _ in range(200):
        loads = rng.integers(0, 120, int(rng.integers(0, 60)))
        big = np.sort(rng.integers(100, 400, int(rng.integers(1, 12))))[::-1]
        if kind == "f64":
            loads, big = loads * 1.25, big * 1.25
        cumulative = np.cumsum(loads)
        ranks = int(rng.integers(2, 6))
        placed, ends = scan(cumulative, big, ranks, OVERSIZE_FILL)
        want_placed, want_ends = reference(cumulative, big, ranks, OVERSIZE_FILL)
        np.testing.assert_array_equal(placed, want_placed)
        np.testing.assert_array_equal(ends, want_ends)


def test_one_rank_has_no_partners():
    with pytest.raises(ValueError, match="num_ranks >= 2"):
        _balance.oversize_partners_i64(np.array([1]), np.array([5]), 1, OVERSIZE_FILL)
