"""Child processes that die with the process that started them, whatever ends it (SIGKILL too),
stopped or not: each command runs under a keeper that kills everything below it when it ends.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import multiprocessing.pool

# The keeper (this file run as a script, standard library only) is the child that `Popen`
# starts; the command is the keeper's child. The kernel tells the keeper when its parent dies (a
# parent-death signal, which a SIGKILL of the parent cannot prevent) and hands it every process
# orphaned below it (it is a child subreaper), whatever process group that process put itself
# in, setsid included (torchrun's ranks, a daemon). So when the parent dies, or the command ends,
# the keeper SIGKILLs whatever is left below it (a stopped process included), then exits as the
# command did. The command gets SIGKILL if the keeper itself is killed.
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36
DEATH = signal.SIGRTMIN  # the keeper's parent-death signal: unused by anything else here


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)  # this process's C library
    if libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value})")


def _parent(pid: int) -> int | None:
    """The parent of `pid`, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # "pid (comm) state ppid ...": the name may hold spaces and parentheses
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError):  # gone meanwhile
        return None


def _parents() -> dict[int, int]:
    """Every process's parent (pid -> ppid), read from /proc."""
    pids = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
    return {pid: parent for pid in pids if (parent := _parent(pid)) is not None}


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (children, their children, ...), parents before children."""
    below: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        below.setdefault(parent, []).append(child)
    found, queue = [], list(below.get(pid, []))
    while queue:
        p = queue.pop(0)
        found.append(p)
        queue.extend(below.get(p, []))
    return found


def send(pids: Iterable[int], signum: int) -> None:
    """Send `signum` to each of `pids` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def pid_alive(pid: int | str) -> bool:
    """True if process `pid` exists on this host (a pid that is not a number: False)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's
        return True
    return True


def writer_pid(path: str | os.PathLike) -> int | None:
    """The pid a temporary name ends with (`.x.tmp-123`, `.staging-123`, `x.tmp123`)."""
    found = re.search(r"(?:\.tmp-|\.staging-|\.tmp)(\d+)$", os.fspath(path))
    return int(found.group(1)) if found else None


def die_with_parent(parent: int) -> None:
    """In a child process (a pool worker): get SIGKILL when its parent dies; exit now if the
    parent (`parent`, its pid) is gone already. The signal comes when the parent's thread that
    started this process ends: call it only in processes started by a thread that lives as long
    as they are needed (a pool's workers: the thread that created the pool)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def _start_worker(parent: int, leftovers: str | None) -> None:
    """A pool worker's start: it dies with `parent`, leaves a Ctrl-C to it (the pool's owner
    stops the pool: one message, not one traceback per worker) and lists what it would leave
    unfinished where its supervised owner does (`leftovers`: cfmtrain.crash)."""
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if leftovers:
        from cfmtrain import crash  # lazy: the keeper, which runs this file, imports no cfmtrain

        crash.where.leftovers = Path(leftovers)


def pool(processes: int) -> multiprocessing.pool.Pool:
    """A multiprocessing pool (spawn start method) whose workers die with this process and
    ignore SIGINT once started (module docstring of cfmtrain.crash: their leftovers are listed
    with this process's). A Ctrl-C in the fraction of a second while a worker starts, before its
    initializer runs, stops it with a traceback of its own; the pool's owner stops as ever."""
    import multiprocessing  # lazy: the keeper, which runs this file, never needs it

    from cfmtrain import crash  # lazy: as above

    leftovers = crash.where.leftovers
    return multiprocessing.get_context("spawn").Pool(
        processes, initializer=_start_worker,
        initargs=(os.getpid(), None if leftovers is None else str(leftovers)))


class Popen(subprocess.Popen):
    """`subprocess.Popen` of `args` run under a keeper (module docstring). `pid` is the
    keeper's: waiting on it (Popen.wait, os.wait4) gives the command's exit status and, once
    everything the command left is killed, its resource usage; `command_pid` is the command's.
    `send_signal` (`terminate`, `kill`) signals the command. Options apply as to the command,
    except `shell` and `executable` (refused)."""

    def __init__(self, args: Sequence[str | os.PathLike], **kwargs) -> None:
        if kwargs.get("shell") or kwargs.get("executable") or isinstance(args, (str, bytes)):
            raise TypeError("children.Popen takes an argument list, without shell/executable")
        command = [os.fsdecode(a) for a in args]
        read, write = os.pipe()  # the keeper reports the command's pid, or why exec failed
        keeper = [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()),
                  str(write), *command]
        try:
            super().__init__(keeper, pass_fds=(*kwargs.pop("pass_fds", ()), write), **kwargs)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        with os.fdopen(read, "rb") as status:
            report = dict(line.split(b" ", 1) for line in status.read().splitlines())
        self.args = command
        if b"error" in report or b"pid" not in report:
            self.wait()
            for pipe in (self.stdin, self.stdout, self.stderr):
                if pipe is not None:
                    pipe.close()
            if b"error" in report:
                code = int(report[b"error"])
                raise OSError(code, os.strerror(code), command[0])
            raise ChildProcessError(f"the keeper of {command[0]} exited ({self.returncode}) "
                                    "before starting it")
        self.command_pid = int(report[b"pid"])

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the command (if it still runs as the keeper's child)."""
        self.poll()
        if self.returncode is None and _parent(self.command_pid) == self.pid:
            send([self.command_pid], sig)


def stop(proc: Popen) -> None:
    """Stop (SIGSTOP) the command and everything below it, the command first so that it starts
    nothing new; the keeper stays awake, to kill them if need be."""
    proc.send_signal(signal.SIGSTOP)
    stopped: set[int] = set()
    while new := [p for p in descendants(proc.pid)
                  if p not in stopped and p != proc.command_pid]:  # until none started meanwhile
        send(new, signal.SIGSTOP)
        stopped.update(new)


def cont(proc: Popen) -> None:
    """Continue (SIGCONT) what `stop` stopped, the command last."""
    send([p for p in descendants(proc.pid) if p != proc.command_pid], signal.SIGCONT)
    proc.send_signal(signal.SIGCONT)


def run(args: Sequence[str | os.PathLike], *, input=None, capture_output: bool = False,
        timeout: float | None = None, check: bool = False, **kwargs
        ) -> subprocess.CompletedProcess:
    """`subprocess.run` with `Popen` above: on a timeout or an error the command and
    everything below it are killed."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with Popen(args, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except BaseException:  # a timeout, a KeyboardInterrupt
            proc.kill()
            proc.wait()
            raise
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, out, err)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _kill_below() -> None:
    """SIGKILL every process below this one, until it has no child left (all reaped): a process
    orphaned meanwhile comes to this subreaper and is killed in the next pass."""
    me = os.getpid()
    while True:
        send(descendants(me), signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _exit_as(status: int) -> None:
    """End this process as the command ended: the same exit code, or death by its signal."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        _prctl(PR_SET_DUMPABLE, 0)  # no core file of the keeper: the command's tells it all
        if signum != signal.SIGKILL:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # a signal whose default is not to end a process
    os._exit(os.waitstatus_to_exitcode(status))


def _keep(parent: int, report: int, command: list[str]) -> None:
    """The keeper's main (module docstring): run `command`, kill what is below at its end or
    at the death of `parent`, exit as the command did."""
    # every signal waits (sigwaitinfo) or stays pending: a stop meant for the command (a
    # Ctrl-C, a job's SIGTERM to the whole group) must not end the keeper, nor a terminal
    # stop it; the command is signalled directly (Popen.send_signal)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    _prctl(PR_SET_PDEATHSIG, DEATH)
    if os.getppid() != parent:  # it died before the signal was set: nothing started yet
        os._exit(1)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    me = os.getpid()
    os.set_inheritable(report, False)  # closed when the command's exec succeeds
    pid = os.fork()
    if pid == 0:
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != me:
                os._exit(1)
            for s in (signal.SIGPIPE, signal.SIGXFSZ):  # as subprocess's restore_signals
                signal.signal(s, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.execvp(command[0], command)
        except OSError as err:
            os.write(report, f"error {err.errno}\n".encode())
        os._exit(127)
    os.write(report, f"pid {pid}\n".encode())
    os.close(report)
    status = None
    while status is None:
        info = signal.sigwaitinfo({DEATH, signal.SIGCHLD})
        if info.si_signo == DEATH and os.getppid() != parent:
            # the parent died (the signal also comes when only the thread that started the
            # keeper ends, the parent still running): no one waits for the command any more
            _kill_below()
            os._exit(128 + signal.SIGKILL)
        while True:  # reap the command, or orphans that came here
            try:
                done, code = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if done == 0:
                break
            if done == pid:
                status = code
    _kill_below()  # what the command left running or stopped
    _exit_as(status)


if __name__ == "__main__":
    _keep(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
