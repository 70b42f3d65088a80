"""A training process run one epoch per turn, so that trainings in separate processes (cfmtrain's
and mace-torch's own script) can take paired rounds (measure.paired.run_rounds): a round is
one epoch of each, in a shuffled order, and a slow minute of the host falls on the epochs of
that round alone.

The process starts in its first turn. A turn continues it (SIGCONT) and stops it (SIGSTOP) as
soon as its count of finished epochs, read from its own outputs, has grown by one. The signals
go to the process and each of its descendants: torchrun puts every rank in a process group of
its own, which a signal to the launcher's group would miss. The wall-clock
intervals it spent stopped are recorded, so that a time the process measured across a stop
can be corrected (`stopped_within`). The process runs under a keeper (cfmtrain.children): if
the process holding the turns dies, however (SIGKILL too), the training dies with it, stopped or
not, descendants included.
"""

from __future__ import annotations

import math
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cfmtrain import children

POLL_S = 0.02  # how often a turn looks for the epoch's end
UNWIND = (signal.SIGTERM, signal.SIGHUP)  # stops that end the process (SIGINT raises already)


def stopped_within(stops: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of the intervals `stops` (wall-clock) that fall between `start` and `end`."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in stops)


def _exit_on_stop(signum: int, frame: object) -> None:
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
        self.proc: children.Popen | None = None
        self.stops: list[tuple[float, float]] = []  # wall-clock (time.time) intervals stopped
        self.started = self.ended = math.nan
        self.turns = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> EpochTurns:
        # a SIGTERM (a cancelled job) or SIGHUP (a closed terminal) unwinds, so that close()
        # kills the processes now, and their keepers need not
        self._previous = {s: signal.signal(s, _exit_on_stop) for s in UNWIND}
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.close()
        finally:
            for s, handler in self._previous.items():
                signal.signal(s, handler)

    def _start(self) -> None:
        with open(self.log, "a" if self.append else "w") as out:
            self.started = time.time()
            self.proc = children.Popen(self.command, env=self.env, cwd=self.cwd, stdout=out,
                                       stderr=subprocess.STDOUT)

    def _continue(self) -> None:
        assert self.proc is not None
        stopped_at = self.stops[-1][0]
        self.stops[-1] = (stopped_at, time.time())
        children.cont(self.proc)

    def _stop(self) -> None:
        assert self.proc is not None
        children.stop(self.proc)
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
        self.proc.kill()  # a stopped process takes SIGKILL too; its keeper kills the rest
        self.proc.wait()
