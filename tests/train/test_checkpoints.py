"""Checkpoint files: the last two kept, each written atomically; load errors name the
file; `--resume auto` moves an unloadable newest checkpoint aside and resumes from the one
before it, bit-exactly; a pickle that would run code is refused after `import mace` (which sets
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 for the whole process).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import mace  # noqa: F401  (sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1, as in `cfmtrain train`)
import pytest
import torch
from helpers import COMMON, REPO, free_port, make_store, rank_env, train

from cfmtrain.train.checkpoint import (
    CHECKPOINT,
    PREVIOUS,
    CheckpointError,
    load_checkpoint,
    load_latest,
    save_checkpoint,
)


def test_last_two_kept_and_written_atomically(tmp_path):
    stale = tmp_path / f".{CHECKPOINT}.tmp-999999999"  # of a writer killed mid-write
    stale.write_bytes(b"half")
    for step in range(4):
        save_checkpoint({"format": 1, "step": step}, tmp_path / CHECKPOINT)
    assert {p.name for p in tmp_path.iterdir()} == {CHECKPOINT, PREVIOUS}
    assert load_checkpoint(tmp_path / CHECKPOINT)["step"] == 3
    assert load_checkpoint(tmp_path / PREVIOUS)["step"] == 2
    with pytest.raises(Exception):  # noqa: B017 (pickling a lambda fails inside torch.save)
        save_checkpoint({"format": 1, "step": 4, "bad": lambda: 0}, tmp_path / CHECKPOINT)
    assert {p.name for p in tmp_path.iterdir()} == {CHECKPOINT, PREVIOUS}
    assert load_checkpoint(tmp_path / CHECKPOINT)["step"] == 3
    assert load_checkpoint(tmp_path / PREVIOUS)["step"] == 2


def test_load_latest_falls_back_to_the_previous(tmp_path, capsys):
    for step in range(2):
        save_checkpoint({"format": 1, "step": step}, tmp_path / CHECKPOINT)
    (tmp_path / CHECKPOINT).unlink()  # a stop between the two renames of a save
    path, state = load_latest(tmp_path)
    assert (path.name, state["step"]) == (PREVIOUS, 0)
    (tmp_path / PREVIOUS).write_bytes(b"garbage")
    (tmp_path / f"{PREVIOUS}.corrupt").write_bytes(b"an earlier one")
    assert load_latest(tmp_path, main=False) is None  # other ranks: quiet, nothing moved
    assert capsys.readouterr().err == "" and (tmp_path / PREVIOUS).exists()
    assert load_latest(tmp_path) is None  # rank 0: reported, moved aside, kept
    assert f"{tmp_path / PREVIOUS}: cannot load checkpoint" in capsys.readouterr().err
    assert (tmp_path / f"{PREVIOUS}.corrupt.1").read_bytes() == b"garbage"


def _corrupt(path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "random":
        path.write_bytes(os.urandom(len(data)))
    elif how == "empty":
        path.write_bytes(b"")
    else:  # a readable file that is not a checkpoint
        torch.save([1, 2, 3], path)


@pytest.mark.parametrize("how", ["truncated", "random", "empty", "other"])
def test_load_errors_name_the_file(tmp_path, how):
    path = tmp_path / "run" / CHECKPOINT
    save_checkpoint({"format": 1, "model": {"w": torch.ones(4000)}}, path)
    _corrupt(path, how)
    with pytest.raises(CheckpointError, match=str(path)):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nothing.pt")):
        load_checkpoint(tmp_path / "nothing.pt")


def test_malicious_checkpoint_refused_after_import_mace(tmp_path):
    assert os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD") == "1"  # what mace-torch does
    ran = tmp_path / "payload_ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(ran), "w"))  # unpickling this creates a file

    path = tmp_path / CHECKPOINT
    torch.save({"format": 1, "model": {}, "payload": Payload()}, path)
    with pytest.raises(CheckpointError, match=rf"{path}.*refused"):
        load_checkpoint(path)
    assert not ran.exists()
    with pytest.warns(UserWarning):  # a plain torch.load here would run it: the test bites
        torch.load(path)
    assert ran.exists()
    ran.unlink()
    found = load_latest(tmp_path)  # --resume auto: refused, moved aside
    assert found is None and not ran.exists()
    assert (tmp_path / f"{CHECKPOINT}.corrupt").exists() and not path.exists()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncated", "random"])
def test_resume_auto_moves_corrupt_checkpoint_aside(data, full_run, tmp_path, capsys, how):
    steps = json.loads((full_run / "summary.json").read_text())["steps_per_epoch"]
    stop_at = steps + 2  # inside the second epoch; checkpoints after every step
    assert train(data[0], data[1], tmp_path, f"max_steps={stop_at}", "checkpoint_every=1") == 0
    assert load_checkpoint(tmp_path / CHECKPOINT)["global_step"] == stop_at
    assert load_checkpoint(tmp_path / PREVIOUS)["global_step"] == stop_at - 1
    _corrupt(tmp_path / CHECKPOINT, how)
    capsys.readouterr()

    assert train(data[0], data[1], tmp_path, "max_steps=0", "checkpoint_every=1",
                 resume="auto") == 0
    err = capsys.readouterr().err
    assert f"warning: {tmp_path / CHECKPOINT}: cannot load checkpoint" in err
    assert f"moved to {CHECKPOINT}.corrupt, trying an older checkpoint" in err
    assert f"(global step {stop_at - 1})" in err and "starting afresh" not in err
    assert (tmp_path / f"{CHECKPOINT}.corrupt").exists()
    names = {p.name for p in tmp_path.iterdir()}
    assert {CHECKPOINT, PREVIOUS} <= names and not [n for n in names if ".tmp-" in n]
    ref = torch.load(full_run / "final.model", weights_only=False).state_dict()
    got = torch.load(tmp_path / "final.model", weights_only=False).state_dict()
    assert all(torch.equal(ref[k], got[k]) for k in ref)  # the run went on from step - 1
    assert (tmp_path / "summary.json").exists()


def test_explicit_resume_of_corrupt_checkpoint_names_it(data, full_run, tmp_path, capsys):
    path = tmp_path / "given.pt"
    shutil.copy(full_run / CHECKPOINT, path)
    _corrupt(path, "truncated")
    assert train(data[0], data[1], tmp_path / "run", resume=str(path)) == 2
    assert f"{path}: cannot load checkpoint" in capsys.readouterr().err
    assert path.exists()  # a checkpoint named by hand is never moved


@pytest.mark.dist
def test_two_ranks_resume_past_a_corrupt_checkpoint(tmp_path):
    """2 gloo ranks: rank 0 moves the corrupt newest checkpoint aside, rank 1 skips it alike;
    both go on from the one before, the last step is trained again and the run finishes with the
    uninterrupted run's weights."""
    store, split, _ = make_store(tmp_path / "store", n=24)
    out = tmp_path / "run"

    def launch() -> list[str]:
        port = free_port()
        args = [sys.executable, "-m", "cfmtrain.train", "--graphs", str(store), "--split",
                str(split), "--output", str(out), "--resume", "auto",
                *[a for o in (*COMMON, "checkpoint_every=1") for a in ("--set", o)]]
        procs = [subprocess.Popen(args, env=rank_env(r, 2, port), cwd=REPO, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for r in range(2)]
        try:
            outputs = [p.communicate(timeout=600)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
        return outputs

    launch()
    ref = torch.load(out / "final.model", weights_only=False).state_dict()
    total = load_checkpoint(out / CHECKPOINT)["global_step"]
    for name in ("summary.json", "final.model", "test_mae.csv"):  # as Snakemake after a failure
        (out / name).unlink()
    _corrupt(out / CHECKPOINT, "truncated")
    outputs = launch()
    assert f"moved to {CHECKPOINT}.corrupt" in outputs[0], outputs[0]
    assert f"(global step {total - 1})" in outputs[0]
    assert "warning" not in outputs[1], outputs[1]
    got = torch.load(out / "final.model", weights_only=False).state_dict()
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    assert json.loads((out / "summary.json").read_text())["ranks"] == 2
