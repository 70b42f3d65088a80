"""What a supervisor killed outright (SIGSTOP, then SIGKILL) leaves is removed later: its
command's temporary files by the next writer of the same file, or by the next supervisor that
starts, with the supervisor's own record files (named with its pid). A Ctrl-C to a command
with pool workers prints one line, not a traceback per process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO

from cfmtrain.atomic import atomic_path


def generate(out: Path, tmp: Path, *extra: str) -> subprocess.Popen:
    """`python -m cfmtrain generate --workers 2` into `out`, its temporary folder `tmp`, in a
    session of its own (a terminal's Ctrl-C goes to the whole group)."""
    return subprocess.Popen([sys.executable, "-m", "cfmtrain", "generate", "--preset", "mini",
                             "--workers", "2", "--output-dir", str(out), *extra], cwd=REPO,
                            env={**os.environ, "TMPDIR": str(tmp)}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def writing(out: Path, proc: subprocess.Popen, timeout: float = 120) -> list[Path]:
    """Wait until the command has begun its shards (their temporary files are there)."""
    end = time.time() + timeout
    while time.time() < end and proc.poll() is None:
        found = sorted(out.glob(".frames_*.extxyz.tmp-*"))
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no temporary shard in {out}: {proc.communicate()}")


def group_gone(pgid: int, timeout: float = 30) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"processes of group {pgid} still run")


@pytest.mark.slow
def test_a_killed_supervisors_leftovers_are_removed_by_the_next(tmp_path):
    out, tmp = tmp_path / "G", tmp_path / "tmp"
    tmp.mkdir()
    proc = generate(out, tmp)
    left = writing(out, proc)
    os.kill(proc.pid, signal.SIGSTOP)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    group_gone(proc.pid)
    records = sorted(r.name for r in tmp.iterdir())  # the record and its leftovers list
    assert len(records) == 2 and all(r.startswith(f"cfmtrain-where-{proc.pid}-") for r in records)
    assert all(path.exists() for path in left)  # what the kill left, as before

    # any supervisor that starts removes the dead one's records and what they list
    done = subprocess.run([sys.executable, "-m", "cfmtrain", "generate", "--help"], cwd=REPO,
                          env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert list(tmp.iterdir()) == []
    assert not any(path.exists() for path in left)


def test_the_next_writer_removes_temporary_files_of_writers_that_are_gone(tmp_path):
    """A writer killed outright (here: a process that exits, leaving its temporary file, as
    a SIGKILL does) and a live one: the next writer removes only the dead one's."""
    target = tmp_path / "frames_0000.extxyz"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = tmp_path / f".{target.name}.tmp-{int(dead.stdout)}"
    stale.write_text("cut short")
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        busy = tmp_path / f".{target.name}.tmp-{alive.pid}"
        busy.write_text("being written")
        other = tmp_path / f".other.extxyz.tmp-{int(dead.stdout)}"
        other.write_text("another file's")
        with atomic_path(target) as path:
            path.write_text("complete")
        assert target.read_text() == "complete"
        assert not stale.exists() and busy.exists() and other.exists()
    finally:
        alive.kill()
        alive.wait()


def workers_started(proc: subprocess.Popen, count: int, timeout: float = 120) -> None:
    """Wait until `count` pool workers of the command's process group have started (their
    initializer ran: SIGINT ignored)."""
    end = time.time() + timeout
    while time.time() < end and proc.poll() is None:
        started = 0
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                pid = int(status.parent.name)
                cmdline = (status.parent / "cmdline").read_bytes()
                ignored = next(line for line in status.read_text().splitlines()
                               if line.startswith("SigIgn:"))
                same_group = os.getpgid(pid) == proc.pid
            except (OSError, StopIteration, ValueError):
                continue
            if (same_group and b"spawn_main" in cmdline and b"resource_tracker" not in cmdline
                    and int(ignored.split()[1], 16) >> (signal.SIGINT - 1) & 1):
                started += 1
        if started >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {count} started workers: {proc.communicate()}")


@pytest.mark.slow
def test_ctrl_c_to_a_command_with_pool_workers_prints_one_line(tmp_path):
    """Once its workers run (children.pool: a Ctrl-C while one starts may stop it with a
    traceback of its own), a Ctrl-C stops the command with one line and leaves nothing."""
    out, tmp = tmp_path / "G", tmp_path / "tmp"
    tmp.mkdir()
    proc = generate(out, tmp)
    writing(out, proc)
    workers_started(proc, 2)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: every process of the group
    _, err = proc.communicate(timeout=120)
    lines = [x for x in err.replace("\r", "\n").splitlines()
             if x.strip() and not x.startswith("mini:")]  # the progress bar's
    assert proc.returncode == 128 + signal.SIGINT
    assert lines == ["cfmtrain generate: interrupted"], err[-3000:]
    assert not list(out.glob(".frames_*")) and list(tmp.iterdir()) == []
