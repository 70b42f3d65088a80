"""Algorithm 1 in Python (cfmtrain.balance.portable, for installs without the compiled extension)
against the compiled cfmtrain._balance: every function the training uses gives the same arrays on
random inputs (integer and real sizes, ties, few and many ranks, leftovers the refinement refills,
steps the rebalancing deals again, bins that are not a multiple of R, oversize graphs), and the
whole plan of a training's sampler is the same graph for graph; where each one runs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from cfmtrain import _balance
from cfmtrain.balance import pack, portable
from cfmtrain.balance.pack import pack_plan, packing_backend
from cfmtrain.balance.strategies import algorithm1
from cfmtrain.train.capacity import auto_capacity


def random_sizes(rng: np.random.Generator, kind: str) -> tuple[np.ndarray, float]:
    """Sizes and a capacity: many ties (atom counts), a heavy tail, real costs, graphs above
    half the capacity beside small ones or all between a quarter and two thirds of it
    (leftovers for the refinement), or few graphs for many
    ranks (bins to fill up to a multiple of R)."""
    n = int(rng.integers(1, 40 if kind == "few" else 400))
    if kind in ("ties", "few"):
        sizes = rng.integers(1, 12, n)
    elif kind == "tail":
        sizes = np.minimum(rng.lognormal(2.5, 1.0, n).astype(np.int64) + 1, 400)
    elif kind == "gaps":
        cap = int(rng.integers(20, 200))
        sizes = np.concatenate([rng.integers(cap // 2 + 1, cap, n // 2 + 1),
                                rng.integers(1, cap // 4, n - n // 2)])
        return sizes, float(cap)
    elif kind == "mid":  # between a quarter and two thirds: refills over several thresholds
        cap = int(rng.integers(20, 200))
        return rng.integers(cap // 4, cap * 2 // 3, n), float(cap)
    else:
        sizes = rng.lognormal(0.0, 0.7, n) * 3.0
    capacity = float(sizes.max()) * float(rng.uniform(1.0, 6.0))
    if kind != "real":
        capacity = float(int(capacity))
    return sizes, capacity


def twins(name: str, sizes: np.ndarray):
    suffix = "_i64" if sizes.dtype == np.int64 else "_f64"
    return getattr(_balance, name + suffix), getattr(portable, name + suffix)


def assert_same(a, b):
    a, b = (a, b) if isinstance(a, tuple) else ((a,), (b,))
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and np.array_equal(x, y)


CASES = [(seed, kind) for seed in range(30) for kind in ("ties", "tail", "real", "gaps", "mid",
                                                       "few")]


@pytest.mark.parametrize("seed,kind", CASES)
def test_the_packing_functions_equal_the_compiled_ones(seed, kind):
    rng = np.random.default_rng(seed)
    sizes, capacity = random_sizes(rng, kind)
    cap = capacity if kind == "real" else int(capacity)
    ranks = int(rng.choice([8, 32] if kind == "few" else [1, 2, 3, 8, 32]))
    candidates = np.flatnonzero(rng.random(len(sizes)) < 0.9)
    for seed_ in (-1, int(rng.integers(1 << 40))):
        compiled, ours = twins("order_descending", sizes)
        assert_same(ours(sizes, candidates, seed_), compiled(sizes, candidates, seed_))
    order = compiled(sizes, np.arange(len(sizes)), int(rng.integers(1 << 40)))
    for refine in (False, True):
        for name in ("algorithm1", "pack"):
            compiled, ours = twins(name, sizes)
            assert_same(ours(sizes, order, cap, ranks, refine),
                        compiled(sizes, order, cap, ranks, refine))
    flat, offsets = twins("algorithm1", sizes)[0](sizes, order, cap, ranks, False)
    compiled, ours = twins("finalize", sizes)
    assert_same(ours(sizes, flat, offsets, ranks), compiled(sizes, flat, offsets, ranks))
    steps = compiled(sizes, flat, offsets, ranks)
    compiled, ours = twins("rebalance", sizes)
    assert_same(ours(sizes, *steps, cap, ranks), compiled(sizes, *steps, cap, ranks))
    if ranks > 1:
        loads = np.bincount(np.repeat(np.arange(len(offsets) - 1), np.diff(offsets)),
                            sizes[flat], len(offsets) - 1).astype(sizes.dtype)
        cumulative = np.cumsum(loads[rng.permutation(len(loads))])
        big = np.sort(rng.choice(cumulative[-1:] if len(cumulative) else [1], 3))[::-1]
        big = (big * rng.uniform(0.05, 0.6, 3)).astype(sizes.dtype)
        compiled, ours = twins("oversize_partners", sizes)
        assert_same(ours(cumulative, big, ranks, pack.OVERSIZE_FILL),
                    compiled(cumulative, big, ranks, pack.OVERSIZE_FILL))


def test_the_cases_reach_every_branch():
    """The random cases above refill leftovers, deal uneven steps again and fill bins up to a
    multiple of R: each comparison covers its code, not only Algorithm 1's first round."""
    refilled = dealt = filled = 0
    for seed, kind in CASES:
        rng = np.random.default_rng(seed)
        sizes, capacity = random_sizes(rng, kind)
        cap = capacity if kind == "real" else int(capacity)
        ranks = int(rng.choice([8, 32] if kind == "few" else [1, 2, 3, 8, 32]))
        rng.random(len(sizes))
        order = twins("order_descending", sizes)[0](sizes, np.arange(len(sizes)), -1)
        fn = twins("algorithm1", sizes)[1]
        plain, refined = fn(sizes, order, cap, ranks, False), fn(sizes, order, cap, ranks, True)
        refilled += not np.array_equal(plain[1], refined[1])
        filled += (len(plain[1]) - 1) % ranks != 0
        steps = twins("finalize", sizes)[1](sizes, *plain, ranks)
        dealt += not np.array_equal(twins("rebalance", sizes)[1](sizes, *steps, cap, ranks)[0],
                                    steps[0])
    assert refilled >= 3 and dealt >= 3 and filled >= 10, (refilled, dealt, filled)


@pytest.fixture
def portable_only(monkeypatch):
    """This process as an install without cfmtrain._balance, training on a GPU."""
    monkeypatch.setattr(pack, "_balance", None)
    monkeypatch.setattr(pack, "_use_portable", False)
    with pytest.warns(UserWarning, match="Algorithm 1 runs in Python"):
        assert packing_backend("cuda:0") == "portable"


def plans(**kwargs) -> list:
    """A training sampler's plans: Algorithm 1 randomised per epoch, with oversize graphs."""
    rng = np.random.default_rng(7)
    sizes = np.concatenate([rng.integers(1, 30, 900), rng.integers(100, 160, 6)])
    out = [algorithm1(sizes, 60, ranks, seed=3, epoch=epoch, oversize="own_bin", **kwargs)
           for ranks in (1, 2, 4) for epoch in (0, 1)]
    out.append(pack_plan(rng.random(500) * 4, 6.5, 3))
    return [(p.flat, p.offsets) for p in out] + [auto_capacity(sizes[:900], 4, 2).value]


def test_a_samplers_plans_are_the_same_without_the_compiled_module(request):
    compiled = plans(tolerance=0.02)
    request.getfixturevalue("portable_only")
    assert pack._module() is portable
    for a, b in zip(plans(tolerance=0.02), compiled, strict=True):
        if isinstance(a, tuple):
            assert_same(a, b)
        else:
            assert a == b


def test_a_cpu_run_needs_the_compiled_module_and_the_peers_say_so(monkeypatch):
    monkeypatch.delenv(pack.NO_EXTENSION, raising=False)
    monkeypatch.setattr(pack, "_balance", None)
    monkeypatch.setattr(pack, "_use_portable", False)
    for device in (None, "cpu"):
        with pytest.raises(ImportError, match=r"cfmtrain._balance is not built \(Algorithm 1\)"):
            packing_backend(device)
    with pytest.raises(ImportError, match="_balance is not built"):
        pack_plan([1, 2, 3], 4, 1)  # nothing asked for the Python packer
    with pytest.warns(UserWarning):
        packing_backend("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert packing_backend("cuda") == "portable"  # said once
    with pytest.raises(ImportError, match="next_fit_i64 .* has no pure-Python version"):
        pack.kernel("next_fit", np.array([1, 2]), 3)
