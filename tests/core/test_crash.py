"""No crash without a cause: `python -m cfmtrain` supervises its command in a child process; a
death by signal (a native library's fault, the out-of-memory killer) is reported with the
stage, file and frame, what the child left unfinished is removed, and earlier outputs stay.
The message promises a Python stack only for a fault (faulthandler writes none for a SIGKILL),
and a file and frame only where the record holds them. Also: structures hundreds to thousands
of Angstrom wide, which killed `cfmtrain convert` with SIGFPE inside vesin, now convert."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import ase.io
import numpy as np
import pytest
from ase import Atoms
from helpers import REPO

from cfmtrain import crash


def cfmtrain(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cfmtrain", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def labelled(atoms: Atoms, energy: float = -1.0) -> Atoms:
    atoms.info["REF_energy"] = energy
    atoms.arrays["REF_forces"] = np.zeros((len(atoms), 3))
    return atoms


def many_frames(path: Path, n: int = 4000) -> Path:
    rng = np.random.default_rng(0)
    frames = [labelled(Atoms("Cu4", positions=rng.random((4, 3)) + np.arange(4)[:, None] * 2.0,
                             cell=np.eye(3) * 9, pbc=True), -float(k)) for k in range(n)]
    ase.io.write(path, frames)
    return path


def child_of(out: Path, timeout: float = 60) -> int:
    """The pid of the supervised child converting into `out`: its staging folder's suffix."""
    end = time.time() + timeout
    while time.time() < end:
        found = list(out.glob(".staging-*"))
        if found:
            return int(found[0].name.removeprefix(".staging-"))
        time.sleep(0.05)
    raise AssertionError(f"no staging folder appeared in {out}")


@pytest.mark.slow
@pytest.mark.parametrize("signum, cause", [
    (signal.SIGSEGV, "SIGSEGV (a segmentation fault in native code)"),
    (signal.SIGFPE, "SIGFPE (a floating-point exception in native code)"),
    (signal.SIGKILL, "SIGKILL (sent by the out-of-memory killer, the scheduler or a user"),
])
def test_a_death_by_signal_is_explained_and_cleaned_up(tmp_path, signum, cause):
    source = many_frames(tmp_path / "many.xyz")
    out = tmp_path / "frames"
    first = cfmtrain("convert", "x", "--input", str(tmp_path / "many.xyz"), "--output", str(out),
                     "--no-progress")
    assert first.wait(timeout=600) == 0, first.stderr.read()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    source.write_text(source.read_text() + source.read_text())  # a re-convert, then killed
    proc = cfmtrain("convert", "x", "--input", str(source), "--output", str(out), "--shards", "2",
                    "--no-progress")
    pid = child_of(out)
    time.sleep(0.5)
    os.kill(pid, signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: cfmtrain convert died of {signal.Signals(signum).name}")
    assert cause in last and f"while checking frames, file {source}, frame " in last
    assert f"removed what it left unfinished: {out}/.staging-{pid}" in last
    assert ("writes no stack" in last) == (signum == signal.SIGKILL)  # faulthandler's, else
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the last good output


@pytest.mark.slow
def test_a_stop_is_passed_on_and_leaves_nothing_unfinished(tmp_path):
    source = many_frames(tmp_path / "many.xyz")
    out = tmp_path / "frames"
    proc = cfmtrain("convert", "x", "--input", str(source), "--output", str(out),
                    "--no-progress")
    child_of(out)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)  # to the supervisor, as Snakemake or Slurm stop a job
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and "died of" not in err
    assert list(out.iterdir()) == []


@pytest.mark.slow
def test_a_staging_folder_of_a_killed_conversion_is_removed_by_the_next(tmp_path):
    source = many_frames(tmp_path / "few.xyz", 20)
    out = tmp_path / "frames"
    (out / ".staging-999999999").mkdir(parents=True)  # no such process
    proc = cfmtrain("convert", "x", "--input", str(source), "--output", str(out),
                    "--no-progress")
    assert proc.wait(timeout=300) == 0
    assert sorted(p.name for p in out.iterdir()) == ["frames_0000.extxyz", "manifest.json"]


@pytest.mark.slow
def test_a_molecule_thousands_of_angstrom_wide_converts(tmp_path):
    """Before: exit 136 (SIGFPE in vesin's cell list) with an empty log, --skip-invalid alike."""
    wide = labelled(Atoms("C5", positions=[[0, 0, 0], [1.3, 0, 0], [2200, 0, 0],
                                            [2200, 1700, 0.3], [1100, 800, 0.1]]))
    source = tmp_path / "wide.xyz"
    ase.io.write(source, [wide, labelled(Atoms("CO", positions=[[0, 0, 0], [1.13, 0, 0]]))])
    out = tmp_path / "frames"
    proc = cfmtrain("convert", "x", "--input", str(source), "--output", str(out),
                    "--no-progress")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert json.loads((out / "manifest.json").read_text())["frames"] == 2
    shard = tmp_path / "shard_0000.h5"
    proc = cfmtrain("graphs", "--input", str(out / "frames_0000.extxyz"), "--output", str(shard))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert json.loads(shard.with_suffix(".json").read_text())["edges"] == 4  # C-C and C-O


def test_the_record_holds_stage_file_and_frame_apart(tmp_path):
    record = tmp_path / "record"
    record.write_bytes(b"\0" * crash.RECORD_BYTES)
    where = crash._Where()
    where.attach(str(record))
    where.at("checking frames", tmp_path / "a, b.xyz", 7)
    assert crash._read_record(record) == crash.Where("checking frames", f"{tmp_path}/a, b.xyz", "7")
    where.at("writing the manifest")
    assert crash._read_record(record) == crash.Where("writing the manifest")
    assert str(crash.Where("checking frames", "a.xyz", "7")) == \
        "checking frames, file a.xyz, frame 7"


def test_a_sigkill_message_promises_no_stack_and_names_the_log():
    where = crash.Where("checking frames", "a.xyz", "7")
    text = crash.explain("convert", signal.SIGKILL, where, [], "/logs/convert.log")
    assert text.startswith("error: cfmtrain convert died of SIGKILL (sent by the out-of-memory "
                           "killer, the scheduler or a user")
    assert "while checking frames, file a.xyz, frame 7." in text
    assert text.endswith("A process ended by SIGKILL writes no stack; its output up to then is "
                         "in /logs/convert.log.")
    assert "report" not in text
    other = crash.explain("train", signal.SIGTERM, crash.Where(), [])
    assert "(sent by another process, not passed on by cfmtrain)." in other
    assert other.endswith("writes no stack; its output up to then is above.")
    assert "while" not in other


def test_a_fault_message_names_the_stack_and_only_what_the_record_holds():
    where = crash.Where("checking frames", "a.xyz", "7")
    text = crash.explain("convert", signal.SIGSEGV, where, [])
    assert "(a segmentation fault in native code) while checking frames, file a.xyz, frame 7" \
        in text
    assert text.endswith("The Python stack of the call is above; if the input looks valid, "
                         "please report it with file a.xyz, frame 7 and that stack.")
    staged = crash.explain("train", signal.SIGFPE, crash.Where("training"), [], "/l/train.log")
    assert staged.endswith("The Python stack of the call is in /l/train.log; if the input looks "
                           "valid, please report it with that stack.")
    assert "file" not in staged and "frame" not in staged
