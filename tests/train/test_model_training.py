"""A model to publish: the model preset is what docs/model.md says; the run keeps the model of
its lowest validation loss (best.model: that epoch's EMA weights exactly), stops early after
`patience` validations without a lower loss, switches to Stage Two's loss weights and learning
rate at its epoch, resumes after a SIGTERM inside stage two exactly as the uninterrupted run
goes on, and shows a bar of epochs with the validation errors."""

from __future__ import annotations

import json
import math
import os
import signal

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import train
from mace.tools.torch_geometric.dataloader import Collater

from cfmtrain.batches.data import GraphDataset
from cfmtrain.graphs.split import load_split
from cfmtrain.graphs.store import GraphStore
from cfmtrain.train import presets, selection
from cfmtrain.train.config import OptimConfig, load_config
from cfmtrain.train.metrics import ErrorSums
from cfmtrain.train.model import z_table_of

# a learning rate high enough that the validation loss goes up and down: a best epoch before
# the last, and patience running out
BUMPY = ["keep_best=true", "optim.lr=0.05", "optim.ema_decay=0.5"]
COLUMNS = ["epoch", "steps", "lr", "train_loss", "valid_loss", "valid_mae_energy_per_atom",
           "valid_mae_forces"]


def weights(path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=False).state_dict()


def assert_same_weights(a, b) -> None:
    a, b = weights(a), weights(b)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_model_preset_is_medium_mace_with_its_recipe():
    cfg = load_config(base=presets.model_settings({}))
    m = cfg.model
    assert (m.hidden_irreps, m.max_ell, m.correlation, m.num_interactions) == (
        "128x0e+128x1o", 3, 3, 2)
    assert cfg.variant == "both" and cfg.eval_interval == 1 and cfg.eval_fraction == 1.0
    assert cfg.optim.ema_decay == 0.99 and cfg.optim.scheduler == "plateau"
    assert cfg.stage_two.enabled and cfg.keep_best and cfg.patience > 0
    assert selection.planned_start(cfg) == cfg.epochs // 4 * 3  # mace-torch's start
    assert not cfg.measure_straggler and not cfg.probe_host
    tuned = load_config(base=presets.model_settings({}, fine_tune=True))
    assert tuned.optim.lr < cfg.optim.lr and tuned.epochs < cfg.epochs
    assert tuned.stage_two.lr < cfg.stage_two.lr
    mine = load_config(base=presets.model_settings({"epochs": 7, "optim": {"lr": 0.02}}))
    assert (mine.epochs, mine.optim.lr, mine.optim.ema_decay) == (7, 0.02, 0.99)


def test_patience_brings_stage_two_forward_then_stops():
    cfg = load_config(overrides=["epochs=20", "patience=2", "stage_two.enabled=true"])
    sel = selection.Selection()
    assert selection.stage_two_start(cfg, sel) == 15
    losses = [5.0, 4.0, 4.5, 4.2]  # no gain after epoch 1 twice: stage two at epoch 4
    for epoch, loss in enumerate(losses):
        selection.after_validation(cfg, sel, epoch, loss)
    assert sel.stage_two_early == 4 and sel.stopped_at is None
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.005)
    assert selection.begin_epoch(cfg, sel, 3, optimizer) is None
    assert "stage two from epoch 4" in selection.begin_epoch(cfg, sel, 4, optimizer)
    assert optimizer.param_groups[0]["lr"] == cfg.stage_two.lr and math.isinf(sel.best_loss)
    assert selection.loss_weights(cfg, sel, 4).energy_weight == 1000.0
    for epoch, loss in zip((4, 5, 6), (9.0, 9.5, 9.7), strict=True):  # stage two's own best
        selection.after_validation(cfg, sel, epoch, loss)
    assert sel.best_epoch == 4 and sel.stopped_at == 6


@pytest.fixture(scope="module")
def bumpy(data, tmp_path_factory):
    """A run of 8 epochs whose validation loss goes up and down."""
    out = tmp_path_factory.mktemp("bumpy")
    assert train(data[0], data[1], out, "epochs=8", *BUMPY) == 0
    return out


@pytest.mark.slow
def test_best_model_is_its_epochs_ema_weights(data, bumpy, tmp_path):
    epochs = pd.read_csv(bumpy / "epochs.csv")
    best = int(epochs.valid_loss.idxmin())
    assert best < len(epochs) - 1, "the validation loss must go up after its lowest epoch"
    summary = json.loads((bumpy / "summary.json").read_text())
    assert (summary["best_epoch"], summary["model_file"]) == (best, "best.model")
    assert summary["best_valid_loss"] == pytest.approx(epochs.valid_loss[best])
    # the same run stopped after the best epoch: its last EMA weights are best.model's
    assert train(data[0], data[1], tmp_path, f"epochs={best + 1}", *BUMPY) == 0
    assert_same_weights(bumpy / "best.model", tmp_path / "final.model")
    assert (bumpy / "test_mae.csv").read_text() == (tmp_path / "test_mae.csv").read_text()
    with pytest.raises(AssertionError):  # and not the last epoch's
        assert_same_weights(bumpy / "best.model", bumpy / "final.model")


@pytest.mark.slow
def test_early_stopping_after_patience(data, bumpy, tmp_path):
    losses = pd.read_csv(bumpy / "epochs.csv").valid_loss.tolist()
    low, bad, stop = math.inf, 0, None
    for epoch, loss in enumerate(losses):  # the rule, on the same trajectory's losses
        low, bad = (loss, 0) if loss < low else (low, bad + 1)
        if bad >= 2:
            stop = epoch
            break
    assert stop is not None and stop < 19
    assert train(data[0], data[1], tmp_path, "epochs=20", "patience=2", *BUMPY) == 0
    epochs = pd.read_csv(tmp_path / "epochs.csv")
    assert epochs.epoch.tolist() == list(range(stop + 1))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped_early_after"] == stop and summary["epochs"] == stop + 1


def validation_loss(model_file, store, split, optim: OptimConfig) -> float:
    """The loss of a saved model on the validation split under `optim`'s weights."""
    model = torch.load(model_file, weights_only=False)
    valid = load_split(split)["valid"]
    dataset = GraphDataset(GraphStore(store), valid, z_table_of(model), float(model.r_max),
                           torch.float32)
    batch = Collater([None], [None])([dataset[i] for i in range(len(dataset))])
    sums = ErrorSums()
    sums.add(batch, model(batch.to_dict(), training=False, compute_force=True), False)
    return sums.as_dict(optim)["loss"]


@pytest.mark.slow
def test_stage_two_switches_loss_weights_and_lr_at_its_epoch(data, tmp_path, capsys):
    assert train(data[0], data[1], tmp_path, "epochs=4", "optim.lr=0.01",
                 "stage_two.enabled=true", "stage_two.start_epoch=2", "stage_two.lr=0.0002",
                 "stage_two.energy_weight=500", "stage_two.forces_weight=20") == 0
    assert "stage two from epoch 2: energy weight 500, forces weight 20" in capsys.readouterr().err
    epochs = pd.read_csv(tmp_path / "epochs.csv")
    assert epochs.lr.tolist() == [0.01, 0.01, 0.0002, 0.0002]
    assert json.loads((tmp_path / "summary.json").read_text())["stage_two_from"] == 2
    # the last validation loss is the final EMA weights' under the stage's weights
    two = OptimConfig(energy_weight=500.0, forces_weight=20.0)
    assert epochs.valid_loss.iloc[-1] == pytest.approx(
        validation_loss(tmp_path / "final.model", data[0], data[1], two), rel=1e-4)
    assert epochs.valid_loss.iloc[-1] != pytest.approx(
        validation_loss(tmp_path / "final.model", data[0], data[1], OptimConfig()), rel=1e-2)


@pytest.mark.slow
def test_sigterm_inside_stage_two_resumes_exactly(data, tmp_path, monkeypatch, capsys):
    from cfmtrain.train import loop

    settings = ["epochs=6", "patience=3", "stage_two.enabled=true", "stage_two.start_epoch=3",
                *BUMPY]
    ref = tmp_path / "ref"
    assert train(data[0], data[1], ref, *settings) == 0
    steps = json.loads((ref / "summary.json").read_text())["steps_per_epoch"]
    stop_at, train_step = 3 * steps + 2, loop.train_step  # inside stage two's first epoch

    def step_then_stop(run, *args, **kwargs):
        if run.global_step == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)  # to the handler `train` installed
        return train_step(run, *args, **kwargs)

    got = tmp_path / "got"
    monkeypatch.setattr(loop, "train_step", step_then_stop)
    assert train(data[0], data[1], got, *settings) == 0
    monkeypatch.undo()
    assert f"stopped at global step {stop_at + 1}" in capsys.readouterr().err
    assert not (got / "summary.json").exists() and (got / "best.model").exists()
    assert train(data[0], data[1], got, *settings, resume="auto") == 0
    assert "resuming at epoch 3" in capsys.readouterr().err
    a, b = (pd.read_csv(p / "epochs.csv")[COLUMNS] for p in (ref, got))
    pd.testing.assert_frame_equal(a, b)
    for name in ("best.model", "final.model"):
        assert_same_weights(ref / name, got / name)
    assert (ref / "test_mae.csv").read_text() == (got / "test_mae.csv").read_text()
    keys = ("best_epoch", "best_valid_loss", "stage_two_from", "stopped_early_after")
    summaries = [json.loads((p / "summary.json").read_text()) for p in (ref, got)]
    assert [s[k] for k in keys for s in summaries[:1]] == [summaries[1][k] for k in keys]
    assert summaries[1]["resumed_epochs"] == [3]


@pytest.mark.slow
def test_bar_of_epochs_shows_the_validation_errors(data, tmp_path, capsys):
    assert train(data[0], data[1], tmp_path, "epochs=2", "progress=true", "keep_best=true") == 0
    err = capsys.readouterr().err
    assert "2/2" in err and "epoch" in err
    last = pd.read_csv(tmp_path / "epochs.csv").iloc[-1]
    assert f"valid E {1000 * last.valid_mae_energy_per_atom:.2f} meV/atom" in err
    assert f"F {1000 * last.valid_mae_forces:.1f} meV/Å" in err and "best epoch" in err
    np.testing.assert_array_equal(json.loads((tmp_path / "summary.json").read_text())[
        "best_epoch"], int(pd.read_csv(tmp_path / "epochs.csv").valid_loss.idxmin()))
