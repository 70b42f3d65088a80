"""Algorithm 1 and our refinements: invariants on random and adversarial inputs, compiled ==
pure-Python reference, determinism across processes, oversize handling, size measures."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cfmtrain import _balance
from cfmtrain.balance import (
    algorithm1_reference,
    graph_costs,
    lower_bound_bins,
    pack_bins,
    pack_plan,
    step_balance,
)
from cfmtrain.balance.mixture import mixture_sizes, subset_counts
from cfmtrain.balance.pack import OVERSIZE_FILL, descending_order, rebalance
from cfmtrain.balance.plan import Plan
from cfmtrain.balance.refine import rebalance_reference, refine_reference

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def int_problems(draw):
    """Integer sizes within capacity: uniform, tiny, half-plus-one, full, mixed."""
    capacity = draw(st.integers(1, 60))
    num_ranks = draw(st.integers(1, 9))
    pool = st.sampled_from(["any", "small", "half", "mixed"])
    kind = draw(pool)
    element = {
        "any": st.integers(0, capacity),
        "small": st.integers(0, max(1, capacity // 8)),
        "half": st.sampled_from(sorted({min(capacity // 2 + 1, capacity), capacity, 1})),
        "mixed": st.sampled_from(sorted({min(v, capacity) for v in
                                         (1, 2, capacity // 3, capacity // 2, capacity)})),
    }[kind]
    sizes = draw(st.lists(element, max_size=90))
    return np.asarray(sizes, np.int64), capacity, num_ranks


@st.composite
def float_problems(draw):
    capacity = draw(st.floats(0.5, 50.0))
    num_ranks = draw(st.integers(1, 6))
    sizes = draw(st.lists(st.floats(0.0, capacity), max_size=60))
    return np.asarray(sizes, np.float64), capacity, num_ranks


def compiled_bins(sizes, capacity, num_ranks, order, refine=False):
    fn = _balance.algorithm1_i64 if sizes.dtype == np.int64 else _balance.algorithm1_f64
    flat, offsets = fn(sizes, order, capacity, num_ranks, refine)
    return [flat[offsets[k]:offsets[k + 1]].tolist() for k in range(len(offsets) - 1)]


def check_invariants(bins, sizes, capacity, num_ranks):
    assert len(bins) % num_ranks == 0
    together = np.concatenate(bins) if bins else np.zeros(0, np.int64)
    assert np.array_equal(np.sort(together), np.arange(len(sizes)))  # each graph exactly once
    loads = np.array([sizes[b].sum() for b in bins])
    assert np.all(loads <= capacity)
    if any(len(b) == 0 for b in bins):  # empty only when every bin holds a single graph
        assert all(len(b) <= 1 for b in bins) and len(sizes) < len(bins)
    steps = loads.reshape(-1, num_ranks)
    assert np.all(np.diff(steps, axis=1) <= 0)  # the bins of a step heaviest first


@SETTINGS
@given(int_problems())
def test_compiled_equals_reference_int(problem):
    sizes, capacity, num_ranks = problem
    order = np.argsort(-sizes, kind="stable")
    assert compiled_bins(sizes, capacity, num_ranks, order) == algorithm1_reference(
        sizes.tolist(), capacity, num_ranks)


@SETTINGS
@given(int_problems(), st.integers(0, 2**32 - 1))
def test_compiled_equals_reference_random_ties(problem, seed):
    sizes, capacity, num_ranks = problem
    order = descending_order(sizes, rng=np.random.default_rng(seed))
    assert np.all(np.diff(sizes[order]) <= 0)
    assert compiled_bins(sizes, capacity, num_ranks, order) == algorithm1_reference(
        sizes.tolist(), capacity, num_ranks, order=order.tolist())


@SETTINGS
@given(float_problems())
def test_compiled_equals_reference_float(problem):
    sizes, capacity, num_ranks = problem
    order = np.argsort(-sizes, kind="stable")
    assert compiled_bins(sizes, capacity, num_ranks, order) == algorithm1_reference(
        sizes.tolist(), capacity, num_ranks)


@SETTINGS
@given(int_problems(), st.integers(0, 2**32 - 1))
def test_refined_compiled_equals_reference_int(problem, seed):
    sizes, capacity, num_ranks = problem
    order = descending_order(sizes, rng=np.random.default_rng(seed))
    assert compiled_bins(sizes, capacity, num_ranks, order, refine=True) == refine_reference(
        sizes.tolist(), capacity, num_ranks, order=order.tolist())


@SETTINGS
@given(float_problems())
def test_refined_compiled_equals_reference_float(problem):
    sizes, capacity, num_ranks = problem
    order = np.argsort(-sizes, kind="stable")
    assert compiled_bins(sizes, capacity, num_ranks, order, refine=True) == refine_reference(
        sizes.tolist(), capacity, num_ranks)


@SETTINGS
@given(int_problems())
def test_refinement_acts_only_above_the_goal_and_never_adds_steps(problem):
    sizes, capacity, num_ranks = problem
    order = np.argsort(-sizes, kind="stable")
    plain = compiled_bins(sizes, capacity, num_ranks, order)
    refined = compiled_bins(sizes, capacity, num_ranks, order, refine=True)
    steps = [-(-len(bins) // num_ranks) for bins in (plain, refined)]
    bound = max(num_ranks, lower_bound_bins(sizes, capacity, num_ranks))
    if steps[0] * num_ranks <= bound + num_ranks:
        assert refined == plain
    else:
        assert steps[1] <= steps[0]
    check_invariants(pack_bins(sizes, capacity, num_ranks), sizes, capacity, num_ranks)


@pytest.mark.parametrize("sizes, capacity, plain_bins, refined_bins", [
    ([26, 16, 6, 14, 11, 16, 4, 24, 16], 27, 7, 6),
    ([19, 17, 15, 11, 24, 13, 19, 23, 1, 2, 24], 24, 9, 8),
])
def test_refinement_saves_bins_on_small_cases(sizes, capacity, plain_bins, refined_bins):
    """Algorithm 1 ends two bins above the lower bound here (R = 1); the refinement one."""
    sizes = np.asarray(sizes, np.int64)
    assert len(pack_bins(sizes, capacity, 1, refine=False)) == plain_bins
    refined = pack_bins(sizes, capacity, 1)
    assert len(refined) == refined_bins == lower_bound_bins(sizes, capacity, 1) + 1
    check_invariants(refined, sizes, capacity, 1)


@SETTINGS
@given(st.one_of(int_problems(), float_problems()))
# two equal sizes: the polish's running loads sat an ulp below the sums of the same bins, so the
# compiled rebalance kept a split that the reference (summing afresh) rejected
@example((np.array([0.25, 0.4180968992833932, 0.4180968992833932, 0.15730021512300446]), 1.0, 2))
def test_rebalance_compiled_equals_reference(problem):
    sizes, capacity, num_ranks = problem
    plan = pack_plan(sizes, capacity, num_ranks, refine=False)
    got = rebalance(plan, sizes, capacity)
    want = rebalance_reference(sizes.tolist(), plan.bins(), num_ranks, capacity)
    assert [b.tolist() for b in got.bins()] == want
    check_invariants(got.bins(), sizes, capacity, num_ranks)


def test_rebalance_deals_uneven_steps_by_lpt():
    sizes = np.array([5, 4, 3, 3, 1, 1, 2, 2], np.int64)
    plan = Plan.from_bins([np.array([0, 1]), np.array([6]), np.array([2, 3]), np.array([7])], 2)
    got = rebalance(plan, sizes, 10)  # steps (9, 2) and (6, 2): balance 0.61 and 0.67
    # LPT: 5, 4, then 2 onto the 4 -> (6, 5); 3, 3, then 2 onto the first -> (5, 3)
    assert [b.tolist() for b in got.bins()] == [[1, 6], [0], [2, 7], [3]]
    # capacity 5: step 0 cannot be dealt within it (4 + 2), it stays; step 1 can
    assert [b.tolist() for b in rebalance(plan, sizes, 5).bins()] == [[0, 1], [6], [2, 7], [3]]
    even = Plan.from_bins([np.array([0]), np.array([1, 4])], 2)  # 5 vs 5: left alone
    assert rebalance(even, sizes, 10).flat.tolist() == [0, 1, 4]


def test_refinements_reach_the_balance_goal_with_few_graphs_per_rank():
    """10k mixture graphs on 64 ranks: Algorithm 1's step balance is 0.977; refined >= 0.999."""
    sizes, _ = mixture_sizes(10_000, seed=0)
    plain, refined = (pack_plan(sizes, 3072, 64, refine=r) for r in (False, True))
    assert step_balance(plain.loads(sizes), 64) < 0.98
    assert step_balance(refined.loads(sizes), 64) >= 0.999
    assert len(refined) == len(plain) and refined.loads(sizes).max() <= 3072
    check_invariants(refined.bins(), sizes, 3072, 64)


def test_refinement_reaches_the_goal_on_the_mixture():
    """300k mixture graphs on one rank: Algorithm 1 is 2 bins above the lower bound, refined 1."""
    sizes, _ = mixture_sizes(300_000, seed=1)
    bound = lower_bound_bins(sizes, 3072, 1)
    assert len(pack_plan(sizes, 3072, 1, refine=False)) == bound + 2
    refined = pack_plan(sizes, 3072, 1)
    assert len(refined) == bound + 1 and refined.loads(sizes).max() <= 3072
    assert np.array_equal(np.sort(refined.flat), np.arange(len(sizes)))


@SETTINGS
@given(st.one_of(int_problems(), float_problems()), st.booleans())
def test_fused_pack_equals_algorithm1_then_finalize(problem, refine):
    """`pack_*` places graphs straight into step order; it must equal finalize(algorithm1)."""
    sizes, capacity, num_ranks = problem
    suffix = "_i64" if sizes.dtype == np.int64 else "_f64"
    order = np.argsort(-sizes, kind="stable")
    fused = getattr(_balance, "pack" + suffix)(sizes, order, capacity, num_ranks, refine)
    flat, offsets = getattr(_balance, "algorithm1" + suffix)(sizes, order, capacity, num_ranks,
                                                               refine)
    two_step = getattr(_balance, "finalize" + suffix)(sizes, flat, offsets, num_ranks)
    if refine:
        two_step = getattr(_balance, "rebalance" + suffix)(sizes, *two_step, capacity, num_ranks)
    assert all(np.array_equal(x, y) for x, y in zip(fused, two_step, strict=True))


@SETTINGS
@given(int_problems())
def test_pack_bins_invariants_int(problem):
    sizes, capacity, num_ranks = problem
    check_invariants(pack_bins(sizes, capacity, num_ranks), sizes, capacity, num_ranks)


@SETTINGS
@given(float_problems())
def test_pack_bins_invariants_float(problem):
    sizes, capacity, num_ranks = problem
    check_invariants(pack_bins(sizes, capacity, num_ranks), sizes, capacity, num_ranks)


@pytest.mark.parametrize("sizes, capacity, num_ranks", [
    ([7] * 5, 7, 4),            # an example: 5 full graphs on 4 ranks -> 3 empty bins
    ([7] * 9, 7, 8),            # 9 full graphs on 8 ranks -> 16 bins, 7 empty
    ([0] * 10, 5, 3),           # zero-size graphs
    ([], 10, 4),                # nothing to pack
    ([1] * 3, 10, 8),           # fewer graphs than ranks
    ([6, 5, 5, 5, 4, 4, 1, 1, 1, 1], 10, 2),  # leftovers need a second round
    ([4, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1], 6, 3),
])
def test_adversarial_cases(sizes, capacity, num_ranks):
    sizes = np.asarray(sizes, np.int64)
    check_invariants(pack_bins(sizes, capacity, num_ranks), sizes, capacity, num_ranks)
    order = np.argsort(-sizes, kind="stable")
    assert compiled_bins(sizes, capacity, num_ranks, order) == algorithm1_reference(
        sizes.tolist(), capacity, num_ranks)


def test_forced_empty_bins_exactly_when_needed():
    bins = pack_bins([7] * 5, 7, 4)
    assert [len(b) for b in bins] == [1, 1, 1, 1, 1, 0, 0, 0]
    # 12 small graphs whose algorithm leaves 6 bins: split until a multiple of 4 without empties
    bins = pack_bins([5] * 12, 10, 4)
    assert len(bins) == 8 and all(len(b) > 0 for b in bins)


def test_oversize_error_names_graph_and_size():
    with pytest.raises(ValueError, match=r"graph 2 has size 900, above the bin capacity 768 .*"
                                         r"pass oversize='own_bin'"):
        pack_bins([10, 20, 900, 5, 1000], 768, 2)
    bins = pack_bins([10, 20, 900, 5, 1000], 768, 2, oversize="own_bin")
    assert sorted(map(len, bins)) == [1, 1, 1, 2]
    assert {tuple(b) for b in bins if len(b) == 1} >= {(2,), (4,)}
    with pytest.raises(ValueError, match="oversize must be"):
        pack_bins([1], 2, 1, oversize="skip")


@pytest.mark.parametrize("num_ranks", [2, 4])
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_oversize_graphs_train_beside_small_ones_at_their_own_step_time(num_ranks, seed):
    """The real data's shape (5 TiAl cells of 128 atoms above the auto capacity of 61, among
    molecules and dimers): each large cell's step gives the other ranks small graphs up to its
    size (85-100% of it), so no step holds large cells only and no step is longer than before."""
    sizes = np.array([128] * 5 + [9] * 400 + [6] * 120 + [2] * 120, np.int64)
    rng = None if seed is None else np.random.default_rng(seed)
    plan = pack_plan(sizes, 61, num_ranks, oversize="own_bin", rng=rng)
    assert sorted(plan.flat.tolist()) == list(range(len(sizes)))
    loads = plan.loads(sizes).reshape(-1, num_ranks)
    big_steps = 0
    for step, bins in enumerate(np.array(plan.bins(), dtype=object).reshape(-1, num_ranks)):
        bigs = [b for b in bins if (sizes[b] > 61).any()]
        assert len(bigs) <= 1 and all(len(b) == 1 for b in bigs)
        if bigs:
            big_steps += 1
            assert loads[step].max() == 128
            assert loads[step].min() >= OVERSIZE_FILL * 128
        else:
            assert loads[step].max() <= 61
    assert big_steps == 5


def test_oversize_graphs_share_a_step_when_small_graphs_cannot_fill_it():
    sizes = np.array([1000, 900, 5, 10, 20], np.int64)
    plan = pack_plan(sizes, 768, 2, oversize="own_bin")
    assert sorted(map(sorted, plan.bins()[:2])) == [[0], [1]]  # the two large ones, one step
    single = pack_plan(np.array([128, 128, 9, 9, 9], np.int64), 61, 1, oversize="own_bin")
    assert sorted(map(len, single.bins())) == [1, 1, 3]  # one rank: nothing to fill


@pytest.mark.parametrize("bad, message", [
    ([1, -2, 3], "graph 1 has negative size"),
    ([1.0, float("nan")], "graph 1 has size nan"),
    ([[1, 2]], "one-dimensional"),
    (["a"], "must hold numbers"),
])
def test_bad_sizes_are_named(bad, message):
    with pytest.raises(ValueError, match=message):
        pack_bins(bad, 10, 2)


def test_compiled_checks_its_inputs():
    sizes = np.array([1, 5, 3], np.int64)
    with pytest.raises(ValueError, match="non-increasing"):
        _balance.algorithm1_i64(sizes, np.array([0, 1, 2]), 10, 2)
    with pytest.raises(ValueError, match="outside sizes"):
        _balance.algorithm1_i64(sizes, np.array([1, 7]), 10, 2)
    with pytest.raises(ValueError, match="capacity must be positive"):
        _balance.algorithm1_i64(sizes, np.array([1, 2, 0]), 0, 2)


def test_mixture_balance_and_bins():
    """The Table 3 mixture (100k graphs): the paper's quality, measured on Algorithm 1's plan."""
    sizes, _ = mixture_sizes(100_000, seed=1)
    for num_ranks in (8, 64):
        plan = pack_plan(sizes, 3072, num_ranks)
        loads = plan.loads(sizes)
        bound = lower_bound_bins(sizes, 3072, num_ranks)
        assert bound <= len(plan) <= bound + num_ranks
        assert step_balance(loads, num_ranks) >= 0.999
        assert loads.max() <= 3072


def test_mixture_counts_follow_table3():
    counts = subset_counts(2_650_823)
    assert counts["MPtrj"] == 1_580_312 and counts["Al-HCl(aq)"] == 884
    sizes, subsets = mixture_sizes(10_000, seed=0)
    assert len(sizes) == 10_000 and sizes.min() >= 1 and sizes.max() <= 768
    assert np.all(sizes[subsets == 3] == 768)  # liquid water


def test_deterministic_across_processes():
    """A fresh interpreter (another hash seed) computes the same plans from (sizes, seed, epoch)."""
    code = (
        "import hashlib, numpy as np\n"
        "from cfmtrain.balance.mixture import mixture_sizes\n"
        "from cfmtrain.balance.strategies import algorithm1\n"
        "sizes, _ = mixture_sizes(20000, seed=3)\n"
        "for seed in (None, 7):\n"
        "    p = algorithm1(sizes, 3072, 8, seed=seed, epoch=2)\n"
        "    print(hashlib.sha1(p.flat.tobytes() + p.offsets.tobytes()).hexdigest())\n"
    )
    import hashlib

    from cfmtrain.balance.strategies import algorithm1

    sizes, _ = mixture_sizes(20000, seed=3)
    mine = []
    for seed in (None, 7):
        p = algorithm1(sizes, 3072, 8, seed=seed, epoch=2)
        mine.append(hashlib.sha1(p.flat.tobytes() + p.offsets.tobytes()).hexdigest())
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout.split()
    assert other == mine


def test_graph_costs():
    atoms, edges = np.array([3, 10]), np.array([12, 100])
    assert graph_costs(atoms).tolist() == [3, 10]
    assert graph_costs(atoms, edges, "edges").tolist() == [12, 100]
    assert graph_costs(atoms, edges, "linear", a=2, b=1).tolist() == [18, 120]
    linear = graph_costs(atoms, edges, "linear", a=1.5, b=0.25)
    assert linear.dtype == np.float64 and linear.tolist() == [7.5, 40.0]
    with pytest.raises(ValueError, match="needs num_edges"):
        graph_costs(atoms, measure="edges")
    with pytest.raises(ValueError, match="measure must be"):
        graph_costs(atoms, edges, "volume")
    with pytest.raises(ValueError, match="not both 0"):
        graph_costs(atoms, edges, "linear", a=0, b=0)
