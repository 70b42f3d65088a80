"""No crash without a cause: a command runs as the child of a small supervisor that explains it.

A signal raised inside native code (a floating-point exception or segmentation fault in a
library, the out-of-memory killer's SIGKILL) ends a process before Python can say anything. So
`python -m cfmtrain CMD` runs CMD in a child process; the child notes where it is (stage, file,
frame: `at`) in a small memory-mapped file and registers what it would leave behind if it died
(`leftover`: staging folders, temporary files). If the child dies of a signal, the supervisor
removes the leftovers, prints what died where and exits 1. Stops (SIGTERM, SIGINT, SIGHUP) are
passed on to the child, whose exit code the supervisor then returns (128 + the signal if the
stop killed it, its leftovers removed). The child also enables
faulthandler, so the log holds the Python stack of the native call.
"""

from __future__ import annotations

import faulthandler
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ENV = "CFMTRAIN_WHERE"
RECORD_BYTES = 4096
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
CAUSES = {
    signal.SIGFPE: "a floating-point exception in native code",
    signal.SIGSEGV: "a segmentation fault in native code",
    signal.SIGBUS: "a bus error in native code (a file mapped into memory changed or vanished?)",
    signal.SIGILL: "an illegal instruction (a library built for a newer CPU?)",
    signal.SIGABRT: "an abort in native code",
    signal.SIGKILL: "SIGKILL: the out-of-memory killer or the scheduler (check the job's memory)",
}


class _Where:
    """The child's side: its record of where it is, written in place into the shared file."""

    def __init__(self) -> None:
        self.map: mmap.mmap | None = None
        self.leftovers: Path | None = None

    def attach(self, path: str) -> None:
        with open(path, "r+b") as f:
            self.map = mmap.mmap(f.fileno(), RECORD_BYTES)
        self.leftovers = Path(f"{path}.leftovers")

    def at(self, stage: str, file: object = None, frame: object = None) -> None:
        """Note the stage (and the file and frame) this process is working on."""
        if self.map is None:
            return
        text = stage + (f", file {file}" if file is not None else "") + (
            f", frame {frame}" if frame is not None else "")
        data = text.encode("utf-8", "replace")[:RECORD_BYTES - 1] + b"\0"
        self.map[:len(data)] = data

    def leftover(self, path: str | os.PathLike) -> None:
        """Register `path` (a file or folder) to be removed if this process dies of a signal."""
        if self.leftovers is not None:
            with open(self.leftovers, "a", encoding="utf-8") as f:
                f.write(f"{os.path.abspath(path)}\n")


where = _Where()
at = where.at
leftover = where.leftover


def attach_child() -> None:
    """In a supervised child: open the record and dump Python stacks on a fatal signal."""
    faulthandler.enable(all_threads=True)
    path = os.environ.pop(ENV, None)  # this process's own children are supervised afresh
    if path:
        where.attach(path)


def _read_record(path: Path) -> str:
    try:
        return path.read_bytes().split(b"\0", 1)[0].decode("utf-8", "replace")
    except OSError:
        return ""


def _remove_leftovers(path: Path) -> list[str]:
    removed = []
    try:
        names = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return removed
    for name in dict.fromkeys(names):
        target = Path(name)
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        elif target.exists():
            target.unlink(missing_ok=True)
        else:
            continue
        removed.append(name)
    return removed


def explain(command: str, signum: int, record: str, removed: list[str]) -> str:
    """The one-paragraph error for a child of `command` killed by `signum`."""
    name = signal.Signals(signum).name
    cause = CAUSES.get(signum, f"signal {name}")
    place = f" while {record}" if record else ""
    cleaned = f"; removed what it left unfinished: {', '.join(removed)}" if removed else ""
    return (f"error: cfmtrain {command} died of {name} ({cause}){place}{cleaned}. Its earlier "
            "outputs are as they were. The stack above shows the call; if the input looks "
            "valid, please report it with that file and frame.")


def supervise(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run `python -m cfmtrain argv` as a child (module docstring); its exit code, or 1 after a
    death by signal other than a stop this process passed on."""
    with tempfile.NamedTemporaryFile(prefix="cfmtrain-where-", delete=False) as f:
        f.write(b"\0" * RECORD_BYTES)
        record = Path(f.name)
    leftovers = Path(f"{record}.leftovers")
    passed_on: list[int] = []
    child = subprocess.Popen([sys.executable, "-m", "cfmtrain", *argv],
                             env={**(env or os.environ), ENV: str(record)})

    def forward(signum: int, _frame: object) -> None:
        passed_on.append(signum)
        child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    try:
        if code >= 0:
            return code
        removed = _remove_leftovers(leftovers)  # a stopped child left them as a killed one
        if -code in passed_on:
            return 128 - code
        print(explain(argv[0] if argv else "", -code, _read_record(record), removed),
              file=sys.stderr, flush=True)
        return 1
    finally:
        record.unlink(missing_ok=True)
        leftovers.unlink(missing_ok=True)
