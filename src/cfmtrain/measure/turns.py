"""A training process run one epoch per turn, so that trainings in separate processes (cfmtrain's
and mace-torch's own script) can take paired rounds (measure.paired.run_rounds): a round is
one epoch of each, in a shuffled order, and a slow minute of the host falls on the epochs of
that round alone.

The process starts in its first turn. A turn continues it (SIGCONT) and stops it (SIGSTOP) as
soon as its count of finished epochs, read from its own outputs, has grown by one. The signals
go to the process and each of its descendants: torchrun puts every rank in a process group of
its own, which a signal to the launcher's group would miss. The wall-clock
intervals it spent stopped are recorded, so that a time the process measured across a stop
can be corrected (`stopped_within`).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

POLL_S = 0.02  # how often a turn looks for the epoch's end


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (children, their children, ...)."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stopped_within(stops: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of the intervals `stops` (wall-clock) that fall between `start` and `end`."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in stops)


def _signal(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


class EpochTurns:
    """One training subprocess, run a turn (one epoch) at a time; a context manager that kills
    what is left of it on exit."""

    def __init__(self, name: str, command: Sequence[str], log: Path,
                 epochs_done: Callable[[], int], env: dict | None = None,
                 cwd: Path | None = None, append: bool = False):
        self.name, self.command, self.log = name, list(command), Path(log)
        self.append = append  # to the log, else a new log
        self.epochs_done, self.env, self.cwd = epochs_done, env, cwd
        self.proc: subprocess.Popen | None = None
        self.stops: list[tuple[float, float]] = []  # wall-clock (time.time) intervals stopped
        self.started = self.ended = math.nan
        self.turns = 0
        self._previous = signal.SIG_DFL

    def __enter__(self) -> EpochTurns:
        # a SIGTERM (a cancelled job) unwinds, so that close() kills the stopped processes
        # rather than leaving them stopped for good
        self._previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.close()
        finally:
            signal.signal(signal.SIGTERM, self._previous)

    def _start(self) -> None:
        with open(self.log, "a" if self.append else "w") as out:
            self.started = time.time()
            self.proc = subprocess.Popen(self.command, env=self.env, cwd=self.cwd, stdout=out,
                                         stderr=subprocess.STDOUT)

    def _continue(self) -> None:
        assert self.proc is not None
        _signal(descendants(self.proc.pid), signal.SIGCONT)
        stopped_at = self.stops[-1][0]
        self.stops[-1] = (stopped_at, time.time())
        _signal([self.proc.pid], signal.SIGCONT)

    def _stop(self) -> None:
        assert self.proc is not None
        _signal([self.proc.pid], signal.SIGSTOP)  # stopped first, it starts nothing new
        _signal(descendants(self.proc.pid), signal.SIGSTOP)
        self.stops.append((time.time(), math.inf))

    def _failed(self, what: str) -> RuntimeError:
        return RuntimeError(f"{self.name} exited ({self.proc.returncode}) {what}; "
                            f"see {self.log}")

    def turn(self) -> None:
        """Run the process until one more epoch has finished (starting it the first time),
        then stop it."""
        target = self.turns + 1
        if self.proc is None:
            self._start()
        else:
            self._continue()
        while self.epochs_done() < target:
            if self.proc.poll() is not None:
                raise self._failed(f"before its epoch {target} finished")
            time.sleep(POLL_S)
        self._stop()
        self.turns = target

    def finish(self) -> None:
        """Let the process run to its end (unpaired: what follows its last epoch)."""
        if self.proc is None:
            self._start()
        elif self.stops and math.isinf(self.stops[-1][1]):
            self._continue()
        if self.proc.wait():
            raise self._failed("")
        self.ended = time.time()

    @property
    def running_s(self) -> float:
        """The process's wall seconds from start to end, less the time it was stopped."""
        return self.ended - self.started - sum(b - a for a, b in self.stops)

    def close(self) -> None:
        """Kill the process and its descendants if they still run (stopped or not)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pids = [self.proc.pid, *descendants(self.proc.pid)]
        _signal(pids, signal.SIGKILL)  # a stopped process takes SIGKILL too
        self.proc.wait()
