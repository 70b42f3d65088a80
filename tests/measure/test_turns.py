"""measure.turns: real processes run one epoch per turn. Two "trainings" (a Python script whose
epochs spin for a fixed CPU time, with a child in a session of its own, as torchrun starts its
ranks) alternate in paired rounds; while one has its turn the other, child included, stands
still, and each epoch's own time less its stops is its running time."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

from cfmtrain.children import descendants
from cfmtrain.measure.paired import run_rounds
from cfmtrain.measure.turns import EpochTurns, stopped_within

SCRIPT = """
import subprocess, sys, time
out, epochs, spin = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.01)"],
                         start_new_session=True)
start = time.time()
for epoch in range(epochs):
    cpu = time.process_time()
    while time.process_time() - cpu < spin:
        pass
    end = time.time()
    with open(out, "a") as f:
        f.write(f"{epoch},{end - start},{end},{child.pid}\\n")
    start = end
cpu = time.process_time()
while time.process_time() - cpu < spin:  # what follows the last epoch (a test evaluation)
    pass
child.kill()
"""


def _lines(path) -> list[list[float]]:
    if not path.exists():
        return []
    return [[float(v) for v in line.split(",")] for line in path.read_text().splitlines()]


def _training(tmp_path, name: str, epochs: int, spin: float) -> EpochTurns:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"{name}.csv"
    return EpochTurns(name, [sys.executable, str(script), str(out), str(epochs), str(spin)],
                      tmp_path / f"{name}.log", lambda: len(_lines(out)))


@pytest.mark.slow
def test_turns_alternate_stop_the_whole_tree_and_correct_epoch_times(tmp_path):
    spin = {"a": 0.2, "b": 0.8}
    with _training(tmp_path, "a", 3, spin["a"]) as a, _training(tmp_path, "b", 3, spin["b"]) as b:
        processes = {"a": a, "b": b}
        seen = []

        def arm(name: str):
            def one_epoch() -> float:
                other = processes["b" if name == "a" else "a"]
                before = len(_lines(tmp_path / f"{other.name}.csv"))
                processes[name].turn()
                # the other waited stopped, its child too: no epoch of it meanwhile
                assert len(_lines(tmp_path / f"{other.name}.csv")) == before
                if other.proc is not None:  # its keeper (proc) stays awake, to kill the tree
                    tree = descendants(other.proc.pid)
                    assert len(tree) == 2
                    seen.append({psutil.Process(p).status() for p in tree})
                epoch, raw, end, _ = _lines(tmp_path / f"{name}.csv")[-1]
                return raw - stopped_within(processes[name].stops, end - raw, end)
            return one_epoch

        rounds = run_rounds({"a": arm("a"), "b": arm("b")}, rounds=3, seed=1)
        for process in processes.values():
            process.finish()
    assert seen and all(s == {psutil.STATUS_STOPPED} for s in seen)
    for name, other in (("a", "b"), ("b", "a")):
        lines = _lines(tmp_path / f"{name}.csv")
        assert len(lines) == 3
        held = [line[1] - t for line, t in zip(lines, rounds.times(name), strict=True)]
        # an epoch that spans the other's turn holds the stop in its raw time: at least the
        # other's epoch of CPU time; the corrected time leaves it out, and is never less than
        # the epoch's own CPU time (a busy host may make it more)
        # (two turns in a row stop it only for the moment between them)
        assert any(h > 0.1 for h in held)
        assert all(h > 0.95 * spin[other] for h in held if h > 0.1)
        assert all(t > 0.95 * spin[name] for t in rounds.times(name))
    assert all(t < spin["b"] for t in rounds.times("a"))
    assert rounds.ratio("b", "a").median == pytest.approx(4.0, rel=0.4)
    assert a.running_s < a.ended - a.started


def test_a_process_that_dies_mid_turn_names_its_log_and_leaves_nothing(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import sys\nprint('epoch 0 failed: out of memory')\nsys.exit(3)\n")
    with EpochTurns("crash", [sys.executable, str(script)], tmp_path / "crash.log",
                    lambda: 0) as crash:
        with pytest.raises(RuntimeError, match=r"crash exited \(3\).*crash\.log"):
            crash.turn()
    assert "out of memory" in (tmp_path / "crash.log").read_text()


def test_closing_kills_a_stopped_tree(tmp_path):
    with _training(tmp_path, "a", 50, 0.1) as a:
        a.turn()
        tree = [a.proc.pid, *descendants(a.proc.pid)]
    time.sleep(0.2)
    assert not [p for p in tree if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_a_stopped_controller_leaves_no_stopped_process(tmp_path):
    """SIGTERM to the process running the turns (a cancelled job): it exits, and the training
    it held stopped, child included, is killed rather than left stopped for good."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    pids = tmp_path / "pids"
    controller = tmp_path / "controller.py"
    controller.write_text(f"""
import sys, time
from pathlib import Path
from cfmtrain.children import descendants
from cfmtrain.measure.turns import EpochTurns
out = Path({str(tmp_path / "a.csv")!r})
count = lambda: len(out.read_text().splitlines()) if out.exists() else 0
with EpochTurns("a", [sys.executable, {str(script)!r}, str(out), "50", "0.1"],
                Path({str(tmp_path / "a.log")!r}), count) as a:
    a.turn()
    Path({str(pids)!r}).write_text(" ".join(map(str, [a.proc.pid, *descendants(a.proc.pid)])))
    time.sleep(60)
""")
    proc = subprocess.Popen([sys.executable, str(controller)])
    deadline = time.time() + 60
    while not pids.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    tree = [int(p) for p in pids.read_text().split()]
    assert len(tree) == 3 and all(psutil.Process(p).status() == psutil.STATUS_STOPPED
                                  for p in tree[1:])  # tree[0]: the keeper
    proc.terminate()
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    time.sleep(0.2)
    assert not [p for p in tree if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
