"""A run's writes on a really full disk (a small tmpfs, mounted where the tests run as root) and
under a file-size limit (RLIMIT_FSIZE in a child process, EFBIG): the error names the file and
says what is full, no partial or temporary file is left, the checkpoints already written stay.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import COMMON, REPO, fill, mounted_tmpfs, train
from test_resume_end import assert_same_outputs

from cfmtrain.train.checkpoint import CHECKPOINT, PREVIOUS, load_checkpoint, save_checkpoint
from cfmtrain.train.diskfull import DiskFullError
from cfmtrain.train.summary import append_rows, write_json, write_rows

FIELDS = ("epoch", "loss")


@pytest.fixture
def tmpfs(tmp_path):
    """A 2 MiB tmpfs at tmp_path/disk."""
    with mounted_tmpfs(tmp_path / "disk", "2m") as disk:
        yield disk


def existing(folder: Path) -> dict[str, bytes]:
    """Every file of `folder` but the filler, with its bytes."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "filler"}


def write_each(folder: Path) -> list[tuple[str, int, str]]:
    """(file, errno, message) of each writer of a run's outputs, each writing more than fits."""
    big = [{"epoch": i, "loss": "x" * 100} for i in range(20_000)]  # 2 MB of rows
    writes = {
        CHECKPOINT: lambda p: save_checkpoint({"format": 1, "w": torch.ones(600_000)}, p),
        "epochs.csv": lambda p: write_rows(p, FIELDS, big),
        "steps.csv": lambda p: append_rows(p, FIELDS, big),
        "summary.json": lambda p: write_json(p, {"rows": big}),
    }
    failed = []
    for name, write in writes.items():
        try:
            write(folder / name)
        except DiskFullError as err:
            failed.append((name, err.errno, str(err)))
    return failed


def prepare(folder: Path) -> None:
    """An earlier checkpoint pair and a steps.csv of two rows, written while there was room."""
    for step in (1, 2):
        save_checkpoint({"format": 1, "step": step}, folder / CHECKPOINT)
    append_rows(folder / "steps.csv", FIELDS, [{"epoch": 0, "loss": 1.5}, {"epoch": 0, "loss": 1}])


def check(folder: Path, before: dict, failed: list, reason: str, code: int) -> None:
    assert [name for name, _, _ in failed] == [CHECKPOINT, "epochs.csv", "steps.csv",
                                               "summary.json"]
    for name, number, message in failed:
        assert number == code and message.startswith(f"{folder / name}: not written, {reason}")
        assert f"free space in {folder}" in message
    assert existing(folder) == before  # nothing new, nothing cut short, no temporary file
    assert load_checkpoint(folder / CHECKPOINT)["step"] == 2
    assert load_checkpoint(folder / PREVIOUS)["step"] == 1


def test_writers_on_a_full_disk_name_the_file(tmpfs):
    prepare(tmpfs)
    before = existing(tmpfs)
    fill(tmpfs)
    check(tmpfs, before, write_each(tmpfs), "the disk is full", errno.ENOSPC)


CHILD = """
import json, sys
from pathlib import Path
sys.path[:0] = [sys.argv[2], str(Path(sys.argv[2]).parent)]  # this module's folder, tests/
from test_full_disk import write_each
print(json.dumps(write_each(Path(sys.argv[1]))))
"""


def _limit_file_size(size: int):
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


@pytest.mark.slow
def test_writers_over_a_file_size_limit_name_the_file(tmp_path):
    prepare(tmp_path)
    before = existing(tmp_path)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), str(Path(__file__).parent)],
                          preexec_fn=_limit_file_size(200_000), capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    failed = [tuple(x) for x in json.loads(proc.stdout.splitlines()[-1])]
    check(tmp_path, before, failed, "the file is over this process's file-size limit",
          errno.EFBIG)


@pytest.mark.slow
def test_training_on_a_full_disk_stops_naming_the_checkpoint(data, full_run, tmpfs, capsys):
    out = tmpfs / "run"
    assert train(data[0], data[1], out, "max_steps=3") == 0
    before = existing(out)
    size = (out / CHECKPOINT).stat().st_size
    filler = fill(tmpfs, leave=size // 2)  # room for the CSV rows, not for a checkpoint
    capsys.readouterr()
    assert train(data[0], data[1], out, "checkpoint_every=1", resume="auto") == 1
    err = capsys.readouterr().err
    assert f"cfmtrain train: {out / CHECKPOINT}: not written, the disk is full" in err
    assert "Traceback" not in err and "unexpected pos" not in err
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    assert (out / CHECKPOINT).read_bytes() == before[CHECKPOINT]  # the last one, untouched
    assert load_checkpoint(out / CHECKPOINT)["global_step"] == 3

    filler.unlink()  # room again: the run goes on from its last checkpoint to the end
    assert train(data[0], data[1], out, resume="auto") == 0
    assert_same_outputs(full_run, out)


@pytest.mark.slow
def test_training_over_a_file_size_limit_names_the_file(data, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    out = tmp_path / "run"
    args = [sys.executable, "-m", "cfmtrain.train", "--graphs", str(data[0]), "--split",
            str(data[1]), "--output", str(out), *[a for o in COMMON for a in ("--set", o)]]
    proc = subprocess.run(args, preexec_fn=_limit_file_size(100_000), cwd=REPO, timeout=600,
                          env={**env, "PYTHONWARNINGS": "ignore"}, capture_output=True,
                          text=True)
    assert proc.returncode == 1, proc.stderr
    assert (f"cfmtrain train: {out / CHECKPOINT}: not written, the file is over this "
            "process's file-size limit") in proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected pos" not in proc.stderr
    # the first epoch's rows, then its checkpoint failed: nothing more, nothing partial
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "epochs.csv", "steps.csv"]
