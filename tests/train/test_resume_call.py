"""What a resume takes from the call and what from the checkpoint: the settings of one call
(max_steps, checkpoint_every, warm_up, ...) are the resuming call's, never inherited; a
checkpoint that does not fit the model is refused by name; a change of code version is recorded
with both versions and said in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from helpers import COMMON, REPO, train
from test_resume_end import assert_same_outputs, total_steps

from cfmtrain.train.checkpoint import CHECKPOINT, load_checkpoint
from cfmtrain.train.config import PER_CALL, load_config, run_settings, to_dict


def test_run_settings_drop_every_per_call_key():
    saved = to_dict(load_config(overrides=["max_steps=7", "checkpoint_every=3", "threads=2",
                                           "batch.pin_memory=true", "optim.lr=0.01"]))
    cfg = load_config(base=run_settings(saved))
    assert (cfg.max_steps, cfg.checkpoint_every, cfg.threads, cfg.batch.pin_memory) == (
        0, 0, 0, False)  # the defaults: none given to this call
    assert cfg.optim.lr == 0.01 and saved["max_steps"] == 7  # identity kept, input untouched
    defaults = to_dict(load_config())
    flat = {f"{k}.{j}" if isinstance(v, dict) else k for k, v in defaults.items()
            for j in (v if isinstance(v, dict) else [None])}
    assert set(PER_CALL) <= flat  # every per-call key names a real key


@pytest.mark.slow
def test_explicit_resume_takes_the_calls_stops_not_the_checkpoints(data, full_run, tmp_path,
                                                                  capsys):
    total = total_steps(full_run)
    assert train(data[0], data[1], tmp_path, "max_steps=4", "checkpoint_every=2",
                 "warm_up=false") == 0
    err = capsys.readouterr().err
    assert "max_steps=4 reached" in err and "--resume auto" in err
    assert load_checkpoint(tmp_path / CHECKPOINT)["global_step"] == 4

    # this call's max_steps below the checkpoint's step: nothing trained, the checkpoint kept
    path = str(tmp_path / CHECKPOINT)
    assert train(data[0], data[1], tmp_path, "max_steps=2", resume=path) == 0
    assert "max_steps=2 is reached: nothing trained" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / CHECKPOINT)["global_step"] == 4

    # no max_steps in this call: to the end of the epochs, with this call's other stops
    assert train(data[0], data[1], tmp_path, resume=path) == 0
    state = load_checkpoint(tmp_path / CHECKPOINT)
    assert state["global_step"] == total
    saved = state["config"]
    assert (saved["max_steps"], saved["checkpoint_every"], saved["warm_up"]) == (0, 0, True)
    assert_same_outputs(full_run, tmp_path)


@pytest.mark.slow
def test_resume_auto_stops_at_the_calls_own_max_steps(data, full_run, tmp_path):
    total = total_steps(full_run)
    assert train(data[0], data[1], tmp_path, "max_steps=3") == 0
    assert train(data[0], data[1], tmp_path, f"max_steps={total - 4}", resume="auto") == 0
    assert load_checkpoint(tmp_path / CHECKPOINT)["global_step"] == total - 4
    assert train(data[0], data[1], tmp_path, resume="auto") == 0  # none: to the end
    assert_same_outputs(full_run, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("change, named", [
    (["model.max_ell=3", "model.radial_mlp=[8, 8, 8]"],
     "model.max_ell: 2 in the checkpoint, 3 in this run; model.radial_mlp: [8, 8] in the "
     "checkpoint, [8, 8, 8] in this run"),
    (["model.dtype=float64"], "model.dtype: 'float32' in the checkpoint, 'float64' in this run"),
])
def test_checkpoint_of_another_model_is_refused_by_name(data, full_run, tmp_path, capsys,
                                                        change, named):
    given = tmp_path / "given.pt"
    shutil.copy(full_run / CHECKPOINT, given)
    # one more epoch, so that the checkpoint is resumed (not only finished)
    assert train(data[0], data[1], tmp_path / "run", "epochs=3", *change,
                 resume=str(given)) == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("cfmtrain train:"))
    assert f"{given}: not resumed, this run's settings differ from the checkpoint's ({named})" \
        in line
    assert "size mismatch" not in err and "Traceback" not in err
    assert not (tmp_path / "run" / CHECKPOINT).exists()


@pytest.mark.slow
def test_checkpoint_whose_tensors_do_not_fit_its_settings_is_refused_by_name(
        data, full_run, tmp_path, capsys):
    """Settings the run's own, tensors of another model (as another mace-torch would build):
    refused naming the file and the tensors."""
    state = torch.load(full_run / CHECKPOINT, weights_only=True)
    state["config"]["model"]["max_ell"] = 3  # recorded as this run's, built with max_ell 2
    given = tmp_path / "given.pt"
    torch.save(state, given)
    assert train(data[0], data[1], tmp_path / "run", "epochs=3", "model.max_ell=3",
                 resume=str(given)) == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("cfmtrain train:"))
    assert f"{given}: the checkpoint does not fit this run's model: its model.* settings are " \
        "this run's: the model code differs" in line
    assert "tensors differ" in line and "size mismatch" not in err and "Traceback" not in err


SCRIPT = "import sys; sys.path.insert(0, sys.argv.pop(1)); import runpy; " \
         "runpy.run_module('cfmtrain.train', run_name='__main__')"


@pytest.mark.slow
def test_a_change_of_code_version_on_resume_is_recorded(data, full_run, tmp_path, capsys):
    total = total_steps(full_run)
    out = tmp_path / "run"
    assert train(data[0], data[1], out, "max_steps=2") == 0
    assert train(data[0], data[1], out, "max_steps=3", resume="auto") == 0  # the same code
    assert "code changed" not in capsys.readouterr().err
    first = load_checkpoint(out / CHECKPOINT)["code_versions"]
    assert len(first) == 1 and first[0]["global_step"] == 0

    # the rest of the run by an edited copy of the package: another code version
    code = tmp_path / "code"
    shutil.copytree(REPO / "src" / "cfmtrain", code / "cfmtrain",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(code / "cfmtrain" / "train" / "loop.py", "a") as f:
        f.write("\n# an edit after the checkpoint was written\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    args = ["--graphs", str(data[0]), "--split", str(data[1]), "--output", str(out),
            "--resume", "auto", *[a for o in COMMON for a in ("--set", o)]]
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(code), *args], cwd=tmp_path,
                          env={**env, "PYTHONWARNINGS": "ignore"}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    said = [x for x in proc.stderr.splitlines() if x.startswith("code changed on resume")]
    assert len(said) == 1, proc.stderr
    assert f"{out / CHECKPOINT} was trained to global step 3" in said[0]
    assert first[0]["sources"] in said[0]

    versions = json.loads((out / "summary.json").read_text())["code_versions"]
    assert load_checkpoint(out / CHECKPOINT)["code_versions"] == versions
    assert [v["global_step"] for v in versions] == [0, 3]
    assert versions[0] == first[0] and versions[1]["sources"] != first[0]["sources"]
    assert versions[1]["sources"] in said[0]
    assert load_checkpoint(out / CHECKPOINT)["global_step"] == total
    assert torch.load(out / "final.model", weights_only=False) is not None
