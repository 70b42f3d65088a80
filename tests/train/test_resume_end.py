"""The end of a run: a stop in the last epoch (SIGTERM during the final validation)
resumed with `--resume auto` finishes the run (test set, exported model, summary.json) without
training again; max_steps equal to the run's steps finishes it; a SIGTERM once every output is
written still exits 0.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from helpers import COMMON, REPO, train

from cfmtrain.train import runner
from cfmtrain.train.checkpoint import CHECKPOINT, load_checkpoint

OUTPUTS = ("summary.json", "final.model", "test_mae.csv")


def total_steps(run_folder) -> int:
    summary = json.loads((run_folder / "summary.json").read_text())
    return summary["epochs"] * summary["steps_per_epoch"]


def assert_same_outputs(ref, got) -> None:
    """The same exported weights, test errors and per-step rows as the uninterrupted run."""
    a = torch.load(ref / "final.model", weights_only=False).state_dict()
    b = torch.load(got / "final.model", weights_only=False).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (ref / "test_mae.csv").read_text() == (got / "test_mae.csv").read_text()
    rows = [[line.split(",")[:6] for line in (p / "steps.csv").read_text().splitlines()]
            for p in (ref, got)]
    assert rows[0] == rows[1]  # no step trained twice, none missing
    summary = json.loads((got / "summary.json").read_text())
    assert summary["test_mae_forces"] is not None and summary["val_mae_forces"] is not None
    assert summary["epochs"] == json.loads((ref / "summary.json").read_text())["epochs"]


@pytest.mark.slow
@pytest.mark.parametrize("point", ["last step", "final validation"])
def test_sigterm_at_the_end_then_resume_finishes(data, full_run, tmp_path, monkeypatch, capsys,
                                                 point):
    from cfmtrain.train import loop

    total, evaluate, train_step = total_steps(full_run), runner.evaluate, loop.train_step

    def evaluate_then_stop(run, dataset, *args, **kwargs):
        if dataset is run.valid_set and run.global_step == total:  # the last validation
            os.kill(os.getpid(), signal.SIGTERM)  # to the handler `train` installed
        return evaluate(run, dataset, *args, **kwargs)

    def step_then_stop(run, *args, **kwargs):
        if run.global_step == total - 1:  # the run's last step
            os.kill(os.getpid(), signal.SIGTERM)
        return train_step(run, *args, **kwargs)

    if point == "last step":
        monkeypatch.setattr(loop, "train_step", step_then_stop)
    else:
        monkeypatch.setattr(runner, "evaluate", evaluate_then_stop)
    assert train(data[0], data[1], tmp_path) == 0
    monkeypatch.undo()
    assert f"stopped at global step {total}" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in OUTPUTS)
    state = load_checkpoint(tmp_path / CHECKPOINT)
    assert (state["epoch"], state["batches_done"], state["global_step"]) == (2, 0, total)
    steps_before = (tmp_path / "steps.csv").read_text()
    epochs_before = (tmp_path / "epochs.csv").read_text()

    assert train(data[0], data[1], tmp_path, resume="auto") == 0
    err = capsys.readouterr().err
    assert "finishing it" in err and "starting afresh" not in err and "epoch 0:" not in err
    assert (tmp_path / "steps.csv").read_text() == steps_before
    assert (tmp_path / "epochs.csv").read_text() == epochs_before
    assert load_checkpoint(tmp_path / CHECKPOINT)["global_step"] == total
    assert_same_outputs(full_run, tmp_path)


@pytest.mark.slow
def test_outputs_deleted_after_finish_are_rewritten_without_training(data, full_run, tmp_path,
                                                                     capsys):
    # what Snakemake does after a failed exit: delete the outputs, run the rule again
    shutil.copytree(full_run, tmp_path, dirs_exist_ok=True)
    for name in OUTPUTS:
        (tmp_path / name).unlink()
    assert train(data[0], data[1], tmp_path, resume="auto") == 0
    assert "finishing it" in capsys.readouterr().err
    assert_same_outputs(full_run, tmp_path)
    # a complete run asked again (summary.json there) starts afresh, as before
    assert train(data[0], data[1], tmp_path, "max_steps=1", resume="auto") == 0
    assert "its run is finished: starting afresh" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / CHECKPOINT)["global_step"] == 1
    assert not (tmp_path / "summary.json").exists()  # the old one went when training began
    # a finished and exported run whose summary.json alone was removed (`snakemake --forcerun`
    # deletes the rule's output) is trained again, not only re-finished
    shutil.copytree(full_run, tmp_path, dirs_exist_ok=True)
    (tmp_path / "summary.json").unlink()
    assert train(data[0], data[1], tmp_path, "max_steps=1", resume="auto") == 0
    assert "summary.json removed: a rerun): starting afresh" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / CHECKPOINT)["global_step"] == 1


@pytest.mark.slow
def test_max_steps_equal_to_the_runs_steps_finishes(data, full_run, tmp_path):
    assert train(data[0], data[1], tmp_path, f"max_steps={total_steps(full_run)}") == 0
    assert_same_outputs(full_run, tmp_path)


# A stop that arrives while the interpreter tears down, after every output is written and after
# Python has put the default SIGTERM action back (exit 143): `late` is freed in that teardown.
LATE_SIGTERM = """
import os, signal, sys, time

class Late:
    def __del__(self, kill=os.kill, pid=os.getpid(), sig=signal.SIGTERM, sleep=time.sleep,
                mark=os.open, flags=os.O_CREAT | os.O_WRONLY, path=sys.argv[1]):
        mark(path, flags)
        kill(pid, sig)
        sleep(1.0)

late = Late()
sys.argv = ["cfmtrain train", *sys.argv[2:]]
import cfmtrain.train.__main__
"""


@pytest.mark.slow
def test_sigterm_after_outputs_are_written_exits_0(data, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    out = tmp_path / "run"
    args = ["--graphs", str(data[0]), "--split", str(data[1]), "--output", str(out),
            *[a for o in (*COMMON, "epochs=1") for a in ("--set", o)], "--resume", "auto"]
    proc = subprocess.run([sys.executable, "-c", LATE_SIGTERM, str(tmp_path / "sent"), *args],
                          env={**env, "PYTHONWARNINGS": "ignore"}, cwd=REPO, timeout=600,
                          capture_output=True, text=True)
    assert (tmp_path / "sent").exists(), proc.stderr  # the signal was sent, after the outputs
    assert proc.returncode == 0, proc.stderr
    assert all((out / name).exists() for name in OUTPUTS)
