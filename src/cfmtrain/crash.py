"""No crash without a cause: a command runs as the child of a small supervisor that explains it.

A signal raised inside native code (a floating-point exception or segmentation fault in a
library, the out-of-memory killer's SIGKILL) ends a process before Python can say anything. So
`python -m cfmtrain CMD` runs CMD in a child process; the child notes where it is (stage, file,
frame: `at`) in a small memory-mapped file and registers what it would leave behind if it died
(`leftover`: staging folders, temporary files). If the child dies of a signal, the supervisor
removes the leftovers, prints what died where and exits 1. Stops (SIGTERM, SIGINT, SIGHUP) are
passed on to the child, whose exit code the supervisor then returns (128 + the signal if the
stop killed it, its leftovers removed). The child also enables faulthandler, so the log holds
the Python stack of a fault in native code (not of a SIGKILL, which ends a process at once).
The child runs under a keeper (cfmtrain.children): whatever ends the child or the supervisor,
SIGKILL included, every process below it ends too, a stopped one included. The record's name
holds the supervisor's pid: a supervisor starting removes the records of supervisors that are
gone (killed outright) and the leftovers they list whose writers are gone too.
"""

from __future__ import annotations

import faulthandler
import mmap
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

from cfmtrain import children
from cfmtrain.children import pid_alive, writer_pid
from cfmtrain.diskfull import DiskFullError, writing

ENV = "CFMTRAIN_WHERE"
RECORD_PREFIX = "cfmtrain-where-"  # then the supervisor's pid, "-" and a random part
RECORD_BYTES = 4096
SEP = "\x1f"  # between the record's fields: stage, file, frame
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# the faults faulthandler writes the Python stack for (faulthandler.enable)
FAULTS = {
    signal.SIGFPE: "a floating-point exception in native code",
    signal.SIGSEGV: "a segmentation fault in native code",
    signal.SIGBUS: "a bus error in native code (a file mapped into memory changed or vanished?)",
    signal.SIGILL: "an illegal instruction (a library built for a newer CPU?)",
    signal.SIGABRT: "an abort in native code",
}
KILLED = ("sent by the out-of-memory killer, the scheduler or a user; if the out-of-memory "
          "killer, the kernel log (dmesg) says so: check the job's memory")


class Where(NamedTuple):
    """What a child was doing, as its record held it (empty: nothing noted)."""

    stage: str = ""
    file: str | None = None
    frame: str | None = None

    def __str__(self) -> str:
        return self.stage + (f", file {self.file}" if self.file is not None else "") + (
            f", frame {self.frame}" if self.frame is not None else "")


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
        fields = (stage, "" if file is None else file, "" if frame is None else frame)
        text = SEP.join(f"{v}".replace(SEP, " ") for v in fields)
        data = text.encode("utf-8", "replace")[:RECORD_BYTES - 1] + b"\0"
        self.map[:len(data)] = data

    def leftover(self, path: str | os.PathLike) -> None:
        """Register `path` (a file or folder) to be removed if this process dies of a signal."""
        if self.leftovers is not None:
            with writing(self.leftovers), open(self.leftovers, "a", encoding="utf-8") as f:
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


def _read_record(path: Path) -> Where:
    try:
        text = path.read_bytes().split(b"\0", 1)[0].decode("utf-8", "replace")
    except OSError:
        return Where()
    stage, file, frame = (text.split(SEP) + ["", ""])[:3]
    return Where(stage, file or None, frame or None)


def _log() -> str | None:
    """The file this process's stderr (the child's too) goes to, if it is a file."""
    try:
        path = os.readlink("/proc/self/fd/2")
    except OSError:
        return None
    return path if path.startswith("/") and os.path.isfile(path) else None


def _remove_leftovers(path: Path, dead_writers_only: bool = False) -> list[str]:
    """Remove what the list `path` names (with `dead_writers_only`, only temporary files and
    folders whose name ends with the pid of a process that is gone); what was removed."""
    removed = []
    try:
        names = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return removed
    for name in dict.fromkeys(names):
        target = Path(name)
        if dead_writers_only and ((pid := writer_pid(target)) is None or pid_alive(pid)):
            continue
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        elif target.exists():
            target.unlink(missing_ok=True)
        else:
            continue
        removed.append(name)
    return removed


def explain(command: str, signum: int, where: Where, removed: list[str],
            log: str | None = None) -> str:
    """The one-paragraph error for a child of `command` killed by `signum`, having noted
    `where` it was, its output in the file `log` (None: not a file): it promises a stack only
    for a fault (faulthandler writes none for a SIGKILL or a signal from another process), a
    file and frame only if noted."""
    name = signal.Signals(signum).name
    if signum in FAULTS:
        cause = FAULTS[signum]
    elif signum == signal.SIGKILL:
        cause = KILLED
    else:
        cause = "sent by another process, not passed on by cfmtrain"
    place = f" while {where}" if where.stage else ""
    cleaned = f"; removed what it left unfinished: {', '.join(removed)}" if removed else ""
    text = (f"error: cfmtrain {command} died of {name} ({cause}){place}{cleaned}. Its earlier "
            "outputs are as they were.")
    output = f"its output up to then is in {log}" if log else "its output up to then is above"
    if signum not in FAULTS:
        return f"{text} A process ended by {name} writes no stack; {output}."
    noted = ", ".join(f"{k} {v}" for k, v in (("file", where.file), ("frame", where.frame))
                      if v is not None)
    stack = f"in {log}" if log else "above"
    return (f"{text} The Python stack of the call is {stack}; if the input looks valid, please "
            f"report it with {noted + ' and ' if noted else ''}that stack.")


def remove_dead_records(folder: Path | None = None) -> list[Path]:
    """Remove the records (and leftovers lists) of supervisors that are gone, in `folder` (the
    temporary folder), after removing the leftovers they list whose writers are gone too; the
    records removed."""
    removed = []
    for record in Path(folder or tempfile.gettempdir()).glob(f"{RECORD_PREFIX}*"):
        found = re.fullmatch(rf"{RECORD_PREFIX}(\d+)-[^.]+", record.name)
        if found is None or pid_alive(found.group(1)):
            continue
        leftovers = Path(f"{record}.leftovers")
        _remove_leftovers(leftovers, dead_writers_only=True)
        leftovers.unlink(missing_ok=True)
        record.unlink(missing_ok=True)
        removed.append(record)
    return removed


def supervise(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run `python -m cfmtrain argv` as a child (module docstring); its exit code, or 1 after a
    death by signal other than a stop this process passed on."""
    remove_dead_records()
    prefix = f"{RECORD_PREFIX}{os.getpid()}-"
    with tempfile.NamedTemporaryFile(prefix=prefix, delete=False) as f:
        record = Path(f.name)
        try:
            with writing(record):
                f.write(b"\0" * RECORD_BYTES)
                f.flush()
        except DiskFullError:
            record.unlink(missing_ok=True)
            raise
    leftovers = Path(f"{record}.leftovers")
    passed_on: list[int] = []
    child = children.Popen([sys.executable, "-m", "cfmtrain", *argv],
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
        print(explain(argv[0] if argv else "", -code, _read_record(record), removed, _log()),
              file=sys.stderr, flush=True)
        return 1
    finally:
        record.unlink(missing_ok=True)
        leftovers.unlink(missing_ok=True)
