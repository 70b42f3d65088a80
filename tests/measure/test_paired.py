"""Paired comparisons (cfmtrain.measure.paired): every arm once per round in a recorded shuffled
order, per-round ratios that cancel a drifting host, and quantiles equal to numpy's."""

import time

import numpy as np
import pytest

from cfmtrain.measure.paired import Ratio, run_interleaved, run_rounds, table


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


class EpisodicHost:
    """A simulated host whose speed changes in episodes of `length` pieces of work (slow ones
    1.2-1.8x), whatever arm runs them: the neighbour of a shared machine, on a clock that
    counts pieces."""

    def __init__(self, length: int = 25, seed: int = 2):
        self.rng, self.length, self.pieces, self.speed = np.random.default_rng(seed), length, 0, 1.0

    def piece(self, work: float) -> float:
        if self.pieces % self.length == 0:
            self.speed = self.rng.uniform(1.2, 1.8) if self.rng.random() < 0.5 else 1.0
        self.pieces += 1
        return work * self.speed


def epoch_arms(host: EpisodicHost, pieces: dict[str, int], work: dict[str, float]):
    """Arms of `pieces[name]` pieces of `work[name]` each, as generators (interleaved) that
    yield their share done and return their simulated seconds."""
    def arm(name):
        def turns():
            seconds = 0.0
            for k in range(pieces[name]):
                seconds += host.piece(work[name])
                yield (k + 1) / pieces[name]
            return seconds
        return turns
    return {name: arm(name) for name in pieces}


def test_interleaved_rounds_cancel_slow_episodes_within_a_round():
    """Four arms of one epoch each (steps of 4, 4, 1 and 1 units; 60, 50, 60 and 50 of them),
    the host slow in episodes shorter than an epoch: interleaved, each round's ratios hold
    within 2% of the true ones; the same arms one after another, as run_rounds would run them,
    spread by more than 20%."""
    pieces = {"baseline": 60, "balancer": 50, "kernel": 60, "both": 50}
    work = {"baseline": 4.0, "balancer": 4.0, "kernel": 1.0, "both": 1.0}
    true = {name: 240.0 / (pieces[name] * work[name]) for name in pieces}
    rounds = run_interleaved(epoch_arms(EpisodicHost(), pieces, work), rounds=7, seed=4,
                             warmup=1)
    for name in ("balancer", "kernel", "both"):
        ratio = rounds.ratio("baseline", name)
        np.testing.assert_allclose(ratio.values, true[name], rtol=0.02)
        assert ratio.spread < 0.04
    host = EpisodicHost()
    arms = epoch_arms(host, pieces, work)
    sequential = run_rounds({name: (lambda t=t: drive(t())) for name, t in arms.items()},
                            rounds=7, seed=4, warmup=1)
    spread = sequential.ratio("baseline", "both").values / true["both"]
    assert spread.max() - spread.min() > 0.2, "one after another, the episodes do not cancel"


def test_interleaved_turns_follow_the_shares_and_the_rounds_order():
    """The next piece goes to the arm with the least share done, ties in the round's order;
    the same seed gives the same turns (ranks of one training agree without talking)."""
    def run(seed):
        turns = []

        def arm(name, count):
            def gen():
                for k in range(count):
                    turns.append(name)
                    yield (k + 1) / count
            return gen
        rounds = run_interleaved({"a": arm("a", 2), "b": arm("b", 4)}, rounds=2, seed=seed)
        return turns, rounds
    turns, rounds = run(1)
    for r, first in enumerate(rounds.order[:, 0]):
        names = turns[6 * r:6 * r + 6]
        lead = "ab"[first]
        # shares: the leader at 0 first; then a at 1/2 against b at 1/4: b; ...
        expected = ["a", "b", "b", "a", "b", "b"] if lead == "a" else ["b", "a", "b", "b", "a", "b"]
        assert names == expected
    assert run(1)[0] == turns
    with pytest.raises(TypeError, match="returned True"):
        def flag():
            yield 1.0
            return True
        run_interleaved({"a": flag, "b": flag}, rounds=1)


def drive(turns):
    """Run a generator of turns to its end; its return value."""
    while True:
        try:
            next(turns)
        except StopIteration as end:
            return end.value
