"""A resume continues the run its checkpoint was trained as: a setting other than `epochs` and
the settings of one call (config.PER_CALL) that differs from the checkpoint's is refused in one
line naming the checkpoint and each differing key with both values (--resume PATH), or named
with the run started afresh (--resume auto), never applied mid-run.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers import train

from cfmtrain.train.checkpoint import CHECKPOINT, load_checkpoint
from cfmtrain.train.config import load_config, to_dict
from cfmtrain.train.resume import changed_settings


def test_changed_settings_name_each_key_with_both_values():
    saved = to_dict(load_config(overrides=["optim.scheduler=plateau", "max_steps=3"]))
    wanted = to_dict(load_config(overrides=["optim.scheduler=exponential", "epochs=9",
                                            "optim.forces_weight=1000", "threads=2"]))
    assert changed_settings(saved, wanted) == [
        "optim.forces_weight: 100.0 in the checkpoint, 1000.0 in this run",
        "optim.scheduler: 'plateau' in the checkpoint, 'exponential' in this run"]
    del saved["optim"]["lr"]  # a checkpoint of a cfmtrain without the key
    assert "optim.lr: absent in the checkpoint, 0.005 in this run" in changed_settings(
        saved, wanted)


def refusal(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "load_state_dict" not in err
    lines = [x for x in err.splitlines() if x.startswith("cfmtrain train:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("change, named", [
    (["optim.lr=0.5"], ["optim.lr: 0.005 in the checkpoint, 0.5 in this run"]),
    (["optim.scheduler=exponential", "optim.forces_weight=1000"],
     ["optim.forces_weight: 100.0 in the checkpoint, 1000.0 in this run",
      "optim.scheduler: 'plateau' in the checkpoint, 'exponential' in this run"]),
    (["seed=7"], ["seed: 0 in the checkpoint, 7 in this run"]),
])
def test_a_resume_by_path_with_other_settings_is_refused_naming_them(data, full_run, tmp_path,
                                                                     capsys, change, named):
    given = tmp_path / "given.pt"
    shutil.copy(full_run / CHECKPOINT, given)
    run = tmp_path / "run"
    capsys.readouterr()
    # one more epoch (allowed), so that the checkpoint would be trained on, not only finished
    assert train(data[0], data[1], run, "epochs=3", "max_steps=1000", *change,
                 resume=str(given)) == 2
    line = refusal(capsys)
    assert line.startswith(f"cfmtrain train: {given}: not resumed, this run's settings differ "
                           f"from the checkpoint's ({'; '.join(named)}); only epochs and the "
                           "settings of one call (max_steps")
    assert not (run / CHECKPOINT).exists() and not (run / "summary.json").exists()


@pytest.mark.slow
def test_a_resume_by_path_with_the_checkpoints_settings_goes_on(data, full_run, tmp_path,
                                                                capsys):
    """The same settings given again (and epochs, per-call keys) are no change."""
    given = tmp_path / "given.pt"
    shutil.copy(full_run / CHECKPOINT, given)
    assert train(data[0], data[1], tmp_path / "run", "epochs=3", "optim.lr=0.005", "seed=0",
                 "checkpoint_every=5", resume=str(given)) == 0
    assert "resuming at epoch 2" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / "run" / CHECKPOINT)["epoch"] == 3


@pytest.mark.slow
def test_resume_auto_with_other_settings_starts_afresh_naming_them(data, tmp_path, capsys):
    assert train(data[0], data[1], tmp_path, "max_steps=3") == 0
    assert load_checkpoint(tmp_path / CHECKPOINT)["global_step"] == 3
    capsys.readouterr()
    assert train(data[0], data[1], tmp_path, "max_steps=2", "optim.lr=0.5",
                 resume="auto") == 0
    err = capsys.readouterr().err
    assert (f"{tmp_path / CHECKPOINT}: not resumed, this run's settings differ from the "
            "checkpoint's (optim.lr: 0.005 in the checkpoint, 0.5 in this run): starting "
            "afresh") in err
    state = load_checkpoint(tmp_path / CHECKPOINT)
    assert state["global_step"] == 2 and state["config"]["optim"]["lr"] == 0.5
    assert state["optimizer"]["param_groups"][0]["lr"] == 0.5
    assert torch.is_tensor(state["torch_rng"])
