"""Training config values as a user types them: `--set` values read by
the key's declared type (1e-3 and 5e-07 are floats), every numeric key range-checked when the
config is read (the workflow checks `train.settings` with the same loader at parse time), and
`cfmtrain split` refusing fractions that leave nothing to train on."""

from __future__ import annotations

import argparse
import re

import pytest

from cfmtrain.cli import main
from cfmtrain.train import cli as train_cli
from cfmtrain.train import config as config_mod


def train_args(*sets: str) -> argparse.Namespace:
    """`cfmtrain train` arguments as its own parser reads them."""
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    return parser.parse_args(["--graphs", "g", "--split", "s.npz", "--output", "out",
                              *[a for s in sets for a in ("--set", s)]])


def test_set_values_are_read_by_the_keys_type():
    args = train_args("optim.lr=1e-3", "optim.weight_decay=5e-07", "timeout_s=1E3",
                      "optim.clip_grad=2", "model.r_max=null", "progress=no",
                      "measure_straggler=true", "model.radial_mlp=[8, 8]",
                      'model.hidden_irreps="8x0e+8x1o"', "model.init_model=[my] run;1.model",
                      "epochs=3")
    cfg = config_mod.load_config(args.config, args.overrides)
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.timeout_s, cfg.optim.clip_grad) == (
        1e-3, 5e-7, 1000.0, 2.0)
    assert (cfg.model.r_max, cfg.progress, cfg.measure_straggler, cfg.epochs) == (
        None, False, True, 3)
    assert cfg.model.radial_mlp == [8, 8] and cfg.model.hidden_irreps == "8x0e+8x1o"
    assert cfg.model.init_model == "[my] run;1.model"  # a string key takes the text as typed
    for bad, message in [("epochs=1e3", "epochs: expected an integer, got '1e3'"),
                         ("epochs=2.0", "epochs: expected an integer"),
                         ("epochs=010x", "epochs: expected an integer"),
                         ("optim.lr=nan", "optim.lr: expected a finite number"),
                         ("timeout_s=.inf", "timeout_s: expected a finite number"),
                         ("progress=maybe", "progress: expected true or false"),
                         ("model.radial_mlp=[8", "model.radial_mlp: '\\[8' is not a YAML")]:
        with pytest.raises(config_mod.ConfigError, match=message):
            config_mod.load_config(overrides=[bad])


def test_config_file_numbers_are_yaml_1_2(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim: {lr: 1e-4, weight_decay: 5e-07}\nmodel: {r_max: 5}\n")
    cfg = config_mod.load_config(path)
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.model.r_max) == (1e-4, 5e-7, 5.0)


@pytest.mark.parametrize("override", [
    "seed=-1", "max_steps=-1", "checkpoint_every=-1", "threads=-1", "timeout_s=0",
    "train_fraction=0", "train_fraction=1.5",
    "model.num_interactions=0", "model.max_ell=-1", "model.correlation=0",
    "model.num_bessel=0", "model.num_polynomial_cutoff=0", "model.radial_mlp=[8, 0]",
    "model.r_max=0", "batch.graphs_per_batch=0", "batch.capacity=0",
    "batch.valid_graphs_per_batch=0", "batch.num_workers=-1", "optim.lr=0",
    "optim.weight_decay=-1e-6", "optim.ema_decay=1", "optim.lr_factor=0", "optim.lr_factor=1",
    "optim.patience=-1", "optim.gamma=0", "optim.gamma=1.5", "optim.clip_grad=-1",
    "optim.energy_weight=-1", "optim.forces_weight=-100", "optim.stress_weight=-0.5",
])
def test_numeric_settings_out_of_range_are_refused_when_read(override):
    key = override.split("=")[0]
    with pytest.raises(config_mod.ConfigError, match=rf"config {re.escape(key)}: .* must be"):
        config_mod.load_config(overrides=[override])


def test_all_loss_weights_zero_is_refused():
    with pytest.raises(config_mod.ConfigError, match="optim.energy_weight.*all 0"):
        config_mod.load_config(overrides=["optim.energy_weight=0", "optim.forces_weight=0"])
    config_mod.load_config(overrides=["optim.energy_weight=0"])  # forces alone train


@pytest.mark.parametrize("fractions, message", [
    (("0.5", "0.5"), "--valid 0.5 + --test 0.5 must be < 1"),
    (("0.2", "0.9"), "must be < 1"),
])
def test_split_command_refuses_fractions_summing_to_one(tmp_path, capsys, fractions, message):
    code = main(["split", "--graphs", str(tmp_path / "no-store"), "--output",
                 str(tmp_path / "split.npz"), "--valid", fractions[0], "--test", fractions[1]])
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "split.npz").exists()


@pytest.mark.parametrize("value", ["1.5", "-0.1", "nan"])
def test_split_command_refuses_a_fraction_outside_0_1(tmp_path, capsys, value):
    with pytest.raises(SystemExit):
        main(["split", "--graphs", str(tmp_path), "--output", str(tmp_path / "s.npz"),
              "--valid", value])
    assert "argument --valid" in capsys.readouterr().err


def test_union_keys_read_each_of_their_types(tmp_path):
    """batch.capacity is an integer or auto (the default); model.e0s is fit, average, a file or
    a mapping of element to eV, from --set and from a config file alike."""
    assert config_mod.TrainConfig().batch.capacity == "auto"
    cfg = config_mod.load_config(overrides=["batch.capacity=96", "model.e0s=average"])
    assert (cfg.batch.capacity, cfg.model.e0s) == (96, "average")
    cfg = config_mod.load_config(overrides=["batch.capacity=auto",
                                            "model.e0s={H: -13.6, 8: -2041.5}"])
    assert (cfg.batch.capacity, cfg.model.e0s) == ("auto", {"H": -13.6, "8": -2041.5})
    path = tmp_path / "c.yaml"
    path.write_text("batch: {capacity: 3072}\nmodel: {e0s: frames/e0s.json}\n")
    cfg = config_mod.load_config(path)
    assert (cfg.batch.capacity, cfg.model.e0s) == (3072, "frames/e0s.json")
    for bad, message in [("batch.capacity=big", "batch.capacity: 'big' fits none of its types"),
                         ("batch.capacity=1e3", "batch.capacity: '1e3' fits none"),
                         ("batch.capacity=0", "batch.capacity: 0 must be >= 1"),
                         ("model.e0s={H: low}", "model.e0s: '{H: low}' must be fit, average"),
                         ("model.e0s=fitted", "model.e0s: 'fitted' must be fit")]:
        with pytest.raises(config_mod.ConfigError, match=message):
            config_mod.load_config(overrides=[bad])
