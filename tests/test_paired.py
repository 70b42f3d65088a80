"""Paired comparisons (cfmtrain.measure.paired): every arm once per round in a recorded shuffled
order, per-round ratios that cancel a drifting host, and quantiles equal to numpy's."""

import time

import numpy as np
import pytest

from cfmtrain.measure.paired import Ratio, run_rounds, table


def drifting_arms(work: dict[str, float], seed: int = 1):
    """Arms that report `work * host speed`, the host's speed drifting 15-60% between calls;
    returns (arms, log of (name, speed))."""
    rng = np.random.default_rng(seed)
    state = {"speed": 1.0}
    log = []

    def arm(name):
        def run():
            if len(log) % len(work) == 0:  # the neighbour changes between rounds only
                state["speed"] = rng.uniform(1.15, 1.6) if rng.random() < 0.5 else 1.0
            log.append((name, state["speed"]))
            return work[name] * state["speed"]
        return run

    return {name: arm(name) for name in work}, log


def test_every_arm_runs_once_per_round_in_the_recorded_shuffled_order():
    calls = []
    arms = {name: (lambda n=name: calls.append(n)) for name in "abcd"}
    rounds = run_rounds(arms, rounds=12, seed=7, warmup=1)
    assert calls[:4] == list("abcd"), "one warm-up round, in name order"
    timed = calls[4:]
    for r in range(12):
        ran = timed[4 * r:4 * r + 4]
        assert sorted(ran) == list("abcd")
        assert ran == [rounds.names[k] for k in rounds.order[r]]
    assert len({tuple(row) for row in rounds.order}) > 1, "the order is shuffled"
    again = run_rounds(arms, rounds=12, seed=7, warmup=1)
    np.testing.assert_array_equal(again.order, rounds.order)


def test_paired_ratios_cancel_a_drifting_host():
    arms, log = drifting_arms({"baseline": 3.0, "both": 1.0})
    rounds = run_rounds(arms, rounds=20, seed=3)
    speeds = np.array([s for _, s in log])
    assert speeds.max() / speeds.min() > 1.15, "the host did drift"
    ratio = rounds.ratio("baseline", "both")
    np.testing.assert_allclose(ratio.values, 3.0)
    assert ratio.spread == pytest.approx(0.0, abs=1e-12)
    unpaired = rounds.times("baseline") / np.roll(rounds.times("both"), 1)
    assert np.ptp(unpaired) > 0.3, "ratios across rounds would have measured the neighbour"


def test_quantiles_and_columns_match_numpy():
    values = np.random.default_rng(0).uniform(1.5, 2.5, 11)
    ratio = Ratio.of(values)
    p10, median, p90 = np.quantile(values, [0.1, 0.5, 0.9])
    assert (ratio.p10, ratio.median, ratio.p90) == (p10, median, p90)
    assert ratio.columns() == {"ratio_median": median, "ratio_p10": p10, "ratio_p90": p90,
                               "rounds": 11}
    with pytest.raises(ValueError, match="finite"):
        Ratio.of(np.array([1.0, np.inf]))


def test_table_reports_wall_and_cpu_per_arm():
    def spin(seconds):  # burns at least `seconds` of this process's CPU
        start = time.process_time()
        while time.process_time() - start < seconds:
            pass

    arms = {"sleep": lambda: time.sleep(0.03), "spin": lambda: spin(0.03)}
    rows = {row["arm"]: row for row in table(run_rounds(arms, rounds=3, seed=0), "sleep")}
    assert rows["spin"]["cpu_s_median"] >= 0.03
    assert rows["sleep"]["wall_s_median"] >= 0.03
    assert rows["sleep"]["cpu_s_median"] < rows["spin"]["cpu_s_median"]
    assert rows["sleep"]["ratio_median"] == 1 and rows["sleep"]["rounds"] == 3


def test_fewer_than_two_arms_or_rounds_is_an_error():
    with pytest.raises(ValueError, match="2 arms"):
        run_rounds({"a": lambda: None}, rounds=3)
    with pytest.raises(ValueError, match="1 round"):
        run_rounds({"a": lambda: None, "b": lambda: None}, rounds=0)


def test_an_arm_returning_a_flag_is_refused_not_taken_as_seconds():
    """ASE's Dynamics.run returns a bool: as seconds it would pin every ratio at 1."""
    with pytest.raises(TypeError, match="returned True"):
        run_rounds({"a": lambda: True, "b": lambda: None}, rounds=2)
