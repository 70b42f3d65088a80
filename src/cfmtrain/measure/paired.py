"""Paired comparisons: the one way cfmtrain judges one speed against another.

Arms (callables) run in rounds; within a round every arm runs once, in an order shuffled with a
recorded seed. A slow minute of a shared host then slows every arm of the rounds it overlaps,
and cancels in each round's ratio. The verdict is the median of the per-round ratios with its
10-90% range, never a ratio of absolute means taken at different times.
"""

from __future__ import annotations

import dataclasses
import resource
import time
from collections.abc import Callable, Generator, Mapping

import numpy as np

QUANTILES = (0.1, 0.5, 0.9)
Arm = Callable[[], float | None]  # runs once; may return its own measured seconds
# An interleaved arm: each call starts a generator that yields its share of the work done
# (0-1) after every piece and may return its own measured seconds.
Interleaved = Callable[[], Generator[float, None, float | None]]


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its finished children."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@dataclasses.dataclass(frozen=True)
class Rounds:
    """Each arm's times per round (seconds, rounds x arms in `names` order) and run order."""

    names: tuple[str, ...]
    seconds: np.ndarray  # what each arm measured (its own figure, else its wall time)
    wall: np.ndarray
    cpu: np.ndarray
    order: np.ndarray  # rounds x arms: the arms' indices in the order they ran
    seed: int

    def times(self, name: str) -> np.ndarray:
        """The seconds of arm `name`, one per round."""
        return self.seconds[:, self.names.index(name)]

    def rows(self, arm: str = "arm", seconds: str = "seconds") -> list[dict]:
        """One row per round and arm, in the order they ran: the round and the arm's place in
        it (from 1), the arm (key `arm`), its seconds (key `seconds`), wall and CPU time."""
        return [{"round": r + 1, "position": p + 1, arm: self.names[k],
                 seconds: float(self.seconds[r, k]), "wall_s": float(self.wall[r, k]),
                 "cpu_s": float(self.cpu[r, k])}
                for r, order in enumerate(self.order) for p, k in enumerate(order)]

    def ratio(self, reference: str, candidate: str) -> Ratio:
        """Speed-up of `candidate` over `reference`: per round, reference time / candidate."""
        return Ratio.of(self.times(reference) / self.times(candidate))


@dataclasses.dataclass(frozen=True)
class Ratio:
    """Per-round ratios and their median with its 10-90% range."""

    values: np.ndarray
    median: float
    p10: float
    p90: float

    @classmethod
    def of(cls, values: np.ndarray) -> Ratio:
        values = np.asarray(values, dtype=np.float64)
        if not len(values) or not np.isfinite(values).all():
            raise ValueError(f"paired ratios must be finite and at least one: {values}")
        p10, median, p90 = np.quantile(values, QUANTILES)
        return cls(values, float(median), float(p10), float(p90))

    @property
    def rounds(self) -> int:
        return len(self.values)

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how much the rounds disagree."""
        return (self.p90 - self.p10) / self.median

    def columns(self) -> dict[str, float | int]:
        """The CSV columns every paired comparison writes."""
        return {"ratio_median": self.median, "ratio_p10": self.p10, "ratio_p90": self.p90,
                "rounds": self.rounds}


def _own_seconds(name: str, own: float | None, wall: float) -> float:
    """An arm's seconds: its own figure if it returned one, else its wall time."""
    if isinstance(own, bool):  # e.g. a solver's converged flag: not seconds
        raise TypeError(f"arm {name!r} returned {own!r}: return seconds or None")
    return wall if own is None else float(own)


def _interleave(arms: Mapping[str, Interleaved], names: tuple[str, ...], order: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One round of interleaved arms: the next piece always goes to the arm with the least
    share done (ties: the round's order), so that all of them span the round together; each
    arm's (seconds, wall, CPU) summed over its own pieces only."""
    n = len(names)
    position = {int(k): p for p, k in enumerate(order)}
    live = {int(k): arms[names[k]]() for k in order}
    share = dict.fromkeys(live, 0.0)
    wall, cpu, seconds = np.zeros(n), np.zeros(n), np.zeros(n)
    while live:
        k = min(live, key=lambda j: (share[j], position[j]))
        cpu0, wall0 = _cpu_seconds(), time.perf_counter()
        own, finished = None, False
        try:
            share[k] = float(next(live[k]))
        except StopIteration as end:
            own, finished = end.value, True
        wall[k] += time.perf_counter() - wall0
        cpu[k] += _cpu_seconds() - cpu0
        if finished:
            del live[k]
            seconds[k] = _own_seconds(names[k], own, wall[k])
    return seconds, wall, cpu


RoundOf = Callable[[Mapping, tuple[str, ...], np.ndarray],
                   tuple[np.ndarray, np.ndarray, np.ndarray]]


def _paired(arms: Mapping, rounds: int, seed: int, warmup: int, one_round: RoundOf) -> Rounds:
    """The rounds of either way of running arms: `warmup` untimed rounds in name order, then
    `rounds` timed ones, each in an order shuffled with numpy's default_rng(seed)."""
    if rounds < 1 or len(arms) < 2:
        raise ValueError(f"a paired comparison needs >= 2 arms and >= 1 round "
                         f"({len(arms)} arms, {rounds} rounds)")
    names = tuple(arms)
    rng = np.random.default_rng(seed)
    for _ in range(warmup):
        one_round(arms, names, np.arange(len(names)))
    shape = (rounds, len(names))
    seconds, wall, cpu = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    order = np.zeros(shape, dtype=np.int64)
    for r in range(rounds):
        order[r] = rng.permutation(len(names))
        seconds[r], wall[r], cpu[r] = one_round(arms, names, order[r])
    return Rounds(names, seconds, wall, cpu, order, seed)


def _one_after_another(arms: Mapping[str, Arm], names: tuple[str, ...], order: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One round of arms run once each in `order`: each arm's (seconds, wall, CPU)."""
    n = len(names)
    seconds, wall, cpu = np.zeros(n), np.zeros(n), np.zeros(n)
    for k in order:
        cpu0, wall0 = _cpu_seconds(), time.perf_counter()
        own = arms[names[k]]()
        wall[k] = time.perf_counter() - wall0
        cpu[k] = _cpu_seconds() - cpu0
        seconds[k] = _own_seconds(names[k], own, wall[k])
    return seconds, wall, cpu


def run_rounds(arms: Mapping[str, Arm], rounds: int, seed: int = 0, warmup: int = 0) -> Rounds:
    """Run every arm once per round, in a shuffled order per round (numpy's default_rng(seed)),
    after `warmup` untimed rounds. An arm that returns a number reports its own seconds (e.g.
    an epoch time read from a run's summary); otherwise its wall time counts."""
    return _paired(arms, rounds, seed, warmup, _one_after_another)


def run_interleaved(arms: Mapping[str, Interleaved], rounds: int, seed: int = 0,
                    warmup: int = 0) -> Rounds:
    """Paired rounds whose arms run interleaved, piece by piece, rather than one after
    another: within a round every arm starts, and the arm with the least share done (what its
    generator yielded last) runs its next piece, ties broken by the round's shuffled order
    (numpy's default_rng(seed)). Arms of minutes then share the host's every minute, not
    only the round's. The choice depends on the shares alone, never on time, so processes
    that run the same arms (the ranks of a training) take the same turns. `warmup` untimed
    rounds first."""
    return _paired(arms, rounds, seed, warmup, _interleave)


def table(rounds: Rounds, reference: str) -> list[dict]:
    """A row per arm: its median seconds, wall and CPU time per round, and its paired ratio
    against `reference` (1 for the reference itself)."""
    rows = []
    for name in rounds.names:
        k = rounds.names.index(name)
        ratio = (Ratio.of(np.ones(len(rounds.seconds))) if name == reference
                 else rounds.ratio(reference, name))
        rows.append({"arm": name, "seconds_median": float(np.median(rounds.seconds[:, k])),
                     "wall_s_median": float(np.median(rounds.wall[:, k])),
                     "cpu_s_median": float(np.median(rounds.cpu[:, k])),
                     **ratio.columns(), "seed": rounds.seed})
    return rows
