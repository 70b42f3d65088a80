"""cfmtrain.children with real processes: whatever ends the process that started a command
(SIGKILL included), the command and everything below it die, none is left stopped: trainings
held in turns, the supervisor's child, torchrun's ranks, pool workers. A command's exit status,
resource usage and errors read as if it ran without its keeper."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import REPO

from cfmtrain import children

SPIN = 'import time\nwhile True: time.sleep(0.01)'

# a training that is no cfmtrain code: a child in a process group of its own (setsid, as torchrun
# starts its ranks: no signal to the training's process group reaches it), and one epoch per 50 ms
TRAINING = f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {SPIN!r}], start_new_session=True)
while True:
    time.sleep(0.05)
    with open(sys.argv[1], "a") as f:
        f.write("epoch\\n")
"""

# two trainings in turns: a had its turn and stands stopped, b runs
CONTROLLER = """
import sys
from pathlib import Path
from cfmtrain.measure.turns import EpochTurns
script, folder = sys.argv[1], Path(sys.argv[2])

def training(name):
    out = folder / f"{name}.csv"
    return EpochTurns(name, [sys.executable, script, str(out)], folder / f"{name}.log",
                      lambda: len(out.read_text().splitlines()) if out.exists() else 0)

with training("a") as a, training("b") as b:
    a.turn()
    b.finish()
"""

# a rank (or any command): a child in a process group of its own (setsid) and a stopped one,
# then it waits
RANK = f"""
import os, signal, subprocess, sys, time
for stop in (False, True):
    child = subprocess.Popen([sys.executable, "-c", {SPIN!r}], start_new_session=True)
    if stop:
        os.kill(child.pid, signal.SIGSTOP)
with open(f"{{sys.argv[1]}}.{{os.environ.get('RANK', '0')}}", "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


def with_path(folder: Path) -> str:
    """PYTHONPATH with `folder` first (where the test's rank module is)."""
    return os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])


def state(pid: int) -> str | None:
    """The process's state letter (R, S, T, Z, ...), None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def left(pids: list[int], timeout: float = 10.0) -> dict[int, str]:
    """Those of `pids` still there (not gone, not a zombie) after up to `timeout` s, with
    their state."""
    deadline = time.monotonic() + timeout
    while True:
        there = {p: s for p in pids if (s := state(p)) not in (None, "Z")}
        if not there or time.monotonic() > deadline:
            return there
        time.sleep(0.05)


def tree_of(pid: int, ready, timeout: float = 120) -> list[int]:
    """The processes below `pid` once `ready(them)` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tree = children.descendants(pid)
        if ready(tree):
            return tree
        time.sleep(0.05)
    raise AssertionError(f"not ready below {pid}: {children.descendants(pid)}")


def stopped(tree: list[int]) -> int:
    return sum(state(p) == "T" for p in tree)


def cleanup(proc: subprocess.Popen, tree: list[int]) -> None:
    """If a test failed: kill what it started (by pid), stopped processes included."""
    children.send([proc.pid, *tree], signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP, signal.SIGTERM,
                                    signal.SIGINT])
def test_trainings_in_turns_die_with_their_controller(tmp_path, signum):
    """The reported case: a controller killed while one training stands stopped (SIGKILL:
    before, that training and its child stayed stopped for good, the other ran on; SIGHUP:
    not handled, the same)."""
    (tmp_path / "train.py").write_text(TRAINING)
    (tmp_path / "controller.py").write_text(CONTROLLER)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "controller.py"),
                             str(tmp_path / "train.py"), str(tmp_path)], cwd=REPO)
    tree: list[int] = []
    try:
        # a's training and its child stopped, b's running
        tree = tree_of(proc.pid, lambda t: (tmp_path / "b.csv").exists() and stopped(t) == 2)
        os.kill(proc.pid, signum)
        proc.wait(timeout=30)
        assert left(tree) == {}
    finally:
        cleanup(proc, tree)


def supervised_rank(tmp_path: Path) -> subprocess.Popen:
    """`python -m cfmtrain launch --ranks 1` of RANK: the supervisor (the rank becomes its
    child)."""
    (tmp_path / "holdrank.py").write_text(RANK)
    env = {**os.environ, "PYTHONPATH": with_path(tmp_path)}
    return subprocess.Popen([sys.executable, "-m", "cfmtrain", "launch", "--ranks", "1",
                             "--module", "holdrank", "--", str(tmp_path / "ready")], cwd=REPO,
                            env=env, stderr=subprocess.PIPE, text=True)


def rank_ready(tmp_path: Path):
    return lambda tree: (tmp_path / "ready.0").exists() and stopped(tree) == 1


def test_the_supervisors_child_and_all_below_die_with_the_supervisor(tmp_path):
    proc, tree = supervised_rank(tmp_path), []
    try:
        tree = tree_of(proc.pid, rank_ready(tmp_path))
        proc.kill()
        proc.wait(timeout=30)
        assert left(tree) == {}
    finally:
        cleanup(proc, tree)


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_a_stop_passed_on_leaves_nothing_below(tmp_path, signum):
    proc, tree = supervised_rank(tmp_path), []
    try:
        tree = tree_of(proc.pid, rank_ready(tmp_path))
        proc.send_signal(signum)  # passed on to the rank, which it ends
        assert proc.wait(timeout=30) == 128 + signum
        assert left(tree) == {}
    finally:
        cleanup(proc, tree)


def test_a_killed_child_is_explained_without_a_stack_and_leaves_nothing(tmp_path):
    proc, tree = supervised_rank(tmp_path), []
    try:
        tree = tree_of(proc.pid, rank_ready(tmp_path))
        os.kill(int((tmp_path / "ready.0").read_text()), signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 1
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: cfmtrain launch died of SIGKILL (sent by the "
                               "out-of-memory killer, the scheduler or a user")
        assert "writes no stack; its output up to then is above." in last
        assert "frame" not in last and "stack above" not in last
        assert left(tree) == {}
    finally:
        cleanup(proc, tree)


@pytest.mark.dist
def test_torchruns_ranks_die_with_the_launcher(tmp_path):
    """torchrun starts each rank in a process group of its own (setsid): SIGKILL to `cfmtrain
    launch` (no supervisor) ends torchrun, both ranks and what they started (one child stopped
    each)."""
    (tmp_path / "holdrank.py").write_text(RANK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.Popen([sys.executable, "-m", "cfmtrain.ranks.launch", "--ranks", "2",
                             "--threads", "1", "--module", "holdrank", "--",
                             str(tmp_path / "ready")], cwd=REPO,
                            env={**env, "PYTHONPATH": with_path(tmp_path)})
    tree: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while not all((tmp_path / f"ready.{r}").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        ranks = [int((tmp_path / f"ready.{r}").read_text()) for r in (0, 1)]
        tree = children.descendants(proc.pid)
        assert set(ranks) <= set(tree) and sorted(map(state, tree)).count("T") == 2
        proc.kill()
        proc.wait(timeout=30)
        assert left(tree) == {}
    finally:
        cleanup(proc, tree)


def test_pool_workers_die_with_their_parent(tmp_path):
    script = tmp_path / "pool.py"
    script.write_text("""
import time
from cfmtrain import children
if __name__ == "__main__":
    with children.pool(2) as pool:
        pool.map_async(time.sleep, [600, 600], chunksize=1)
        time.sleep(600)
""")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=REPO)
    tree: list[int] = []
    try:
        # multiprocessing's resource tracker and the 2 workers, one task each
        tree = tree_of(proc.pid, lambda t: len(t) == 3)
        time.sleep(0.5)
        assert len(children.descendants(proc.pid)) == 3  # no worker died (of a bad start)
        proc.kill()
        proc.wait(timeout=30)
        assert left(tree) == {}
    finally:
        cleanup(proc, tree)


def test_a_command_outlives_the_thread_that_started_it():
    """The parent-death signal comes when the starting thread ends: the keeper checks that its
    parent process really died before it kills anything."""
    started = []
    thread = threading.Thread(target=lambda: started.append(
        children.Popen([sys.executable, "-c", SPIN])))
    thread.start()
    thread.join()
    proc = started[0]
    try:
        time.sleep(1.0)
        assert proc.poll() is None and state(proc.command_pid) in ("R", "S")
    finally:
        proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL and left([proc.command_pid]) == {}


def test_exit_status_and_usage_read_as_the_commands():
    assert children.Popen([sys.executable, "-c", "raise SystemExit(3)"]).wait() == 3
    killed = children.Popen([sys.executable, "-c", "import os; os.kill(os.getpid(), 11)"])
    assert killed.wait() == -signal.SIGSEGV
    with pytest.raises(FileNotFoundError):
        children.Popen(["no-such-command-cfmtrain"])
    proc = children.Popen([sys.executable, "-c", "b = bytearray(200 * 2**20); b[::4096] = "
                           "b'x' * len(b[::4096])"])
    _, status, usage = os.wait4(proc.pid, 0)  # what bench kernels and scale read
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0 and usage.ru_maxrss > 200 * 1024
    done = children.run([sys.executable, "-c", "print('out')"], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "out\n")
    with pytest.raises(subprocess.CalledProcessError):
        children.run([sys.executable, "-c", "raise SystemExit(2)"], check=True)


@pytest.mark.slow
def test_a_timeout_kills_all_below_the_command(tmp_path):
    """subprocess.run would kill the command alone: its child, in a process group of its own,
    would run on (and hold the output pipe open)."""
    pid_file = tmp_path / "pid"
    code = (f"import subprocess, sys, time\nc = subprocess.Popen([sys.executable, '-c', {SPIN!r}], "
            f"start_new_session=True)\nopen({str(pid_file)!r}, 'w').write(str(c.pid))\n"
            "time.sleep(600)")
    with pytest.raises(subprocess.TimeoutExpired):
        children.run([sys.executable, "-c", code], capture_output=True, timeout=3)
    assert left([int(pid_file.read_text())]) == {}


def _sigint_handler(_) -> object:
    return signal.getsignal(signal.SIGINT)


@pytest.mark.slow
def test_a_pool_leaves_its_owner_as_it_was_and_its_workers_ignore_ctrl_c():
    """Started workers ignore SIGINT; a Ctrl-C reaches the pool's owner, its handler as before."""
    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda *_: got.append(1))
    try:
        with children.pool(2) as pool:
            handlers = pool.map(_sigint_handler, range(4))
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
        assert got == [1]
        assert set(handlers) == {signal.SIG_IGN}
    finally:
        signal.signal(signal.SIGINT, previous)
