"""Fine-tuning a model (model.init_model) with a replay of its training data: a small
"foundation" trained here on 5% of mini (no weights can be downloaded), fine-tuned on the shipped
examples/own_data files, lowers their test errors; with mini's training graphs replayed, its
force error on mini's validation graphs stays within REPLAY_BOUND of the foundation's. The
model's elements, cutoff and E0s are checked against the data, each refusal naming the file and
the mismatch: when the job starts, and at `snakemake -n` where the config tells them."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from ase.build import molecule
from ase.calculators.emt import EMT
from helpers import COMMON, CUTOFF, REPO, train

from cfmtrain.config_check import check_workflow_config
from cfmtrain.evaluate.errors import error_rows
from cfmtrain.evaluate.frames import frames_store
from cfmtrain.evaluate.predict import predict
from cfmtrain.frames.keys import LabelKeys
from cfmtrain.graphs.build import atoms_to_graph
from cfmtrain.graphs.split import load_split, split_indices
from cfmtrain.graphs.store import GraphStore, write_shard
from cfmtrain.sources.mini import iter_mini_frames
from cfmtrain.train import cli
from cfmtrain.train.config import ConfigError
from cfmtrain.train.model import load_user_model

OWN = REPO / "examples/own_data/cuni_emt.xyz"
OWN_KEYS = LabelKeys.from_mapping({"forces": "force", "virial": "virial"})
REPLAY_BOUND = 1.10  # replay: mini's validation force MAE after <= 1.10x the foundation's
FOUNDATION = ["epochs=16", "keep_best=true", "stage_two.enabled=true",
              "optim.stress_weight=1.0", "batch.graphs_per_batch=2", "variant=both"]
FINE_TUNE = ["epochs=10", "keep_best=true", "stage_two.enabled=true", "optim.stress_weight=1.0",
             "batch.graphs_per_batch=2", "variant=both", "optim.lr=0.001",
             "stage_two.lr=0.0001"]


def with_split(folder: Path, graphs: list[dict], cutoff: float = CUTOFF) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    write_shard(folder / "shard_0000.h5", graphs, cutoff=cutoff)
    parts = split_indices(GraphStore(folder).subsets, (0.15, 0.15), 0)
    np.savez(folder / "split.npz", seed=0, **parts)
    return folder, folder / "split.npz"


def own_store(folder: Path, cutoff: float = CUTOFF) -> tuple[Path, Path]:
    """examples/own_data's Cu/Ni cells as a store with a split."""
    store = frames_store(OWN, OWN_KEYS, cutoff, folder.with_name(folder.name + "_frames"))
    graphs = []
    for i in range(len(store)):
        g = store[i]
        graphs.append({**g, "source_index": i})
    return with_split(folder, graphs, cutoff)


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("fine_tune")
    mini = []
    for i, atoms in enumerate(iter_mini_frames(scale=0.05, seed=0)):
        graph = atoms_to_graph(atoms, CUTOFF)
        graph.pop("min_length")
        mini.append({**graph, "source_index": i})
    return {"mini": with_split(root / "mini", mini), "own": own_store(root / "own")}


@pytest.fixture(scope="module")
def foundation(stores, tmp_path_factory) -> Path:
    """best.model of a tiny model trained on mini (5%)."""
    out = tmp_path_factory.mktemp("foundation")
    assert train(*stores["mini"], out, *FOUNDATION) == 0
    return out / "best.model"


def test_errors(model: Path, store: tuple[Path, Path], part: str) -> pd.Series:
    """The model's errors over all graphs of the part (cfmtrain evaluate's numbers)."""
    indices = load_split(store[1])[part]
    pred = predict(load_user_model(model, np.inf), GraphStore(store[0]), indices)
    return pd.DataFrame([r.row() for r in error_rows(pred)]).set_index("config_type").loc["all"]


test_errors.__test__ = False  # a helper, not a test


def fine_tune(stores, foundation: Path, out: Path, *overrides: str, replay: bool = True) -> int:
    """`cfmtrain train` of the own data from the foundation, with mini replayed."""
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    argv = ["--graphs", str(stores["own"][0]), "--split", str(stores["own"][1]),
            "--output", str(out)]
    if replay:
        argv += ["--replay-graphs", str(stores["mini"][0]), "--replay-split",
                 str(stores["mini"][1])]
    for o in (*COMMON, *FINE_TUNE, f"model.init_model={foundation}", *overrides):
        argv += ["--set", o]
    import signal

    import torch
    handler = signal.getsignal(signal.SIGTERM)
    try:
        return cli.run(parser.parse_args(argv))
    finally:
        signal.signal(signal.SIGTERM, handler)
        torch.set_default_dtype(torch.float32)


@pytest.mark.slow
def test_fine_tuning_lowers_the_datas_errors_and_replay_bounds_minis(stores, foundation,
                                                                     tmp_path):
    out = tmp_path / "tuned"
    assert fine_tune(stores, foundation, out, "model.init_e0s=estimated") == 0
    before = test_errors(foundation, stores["own"], "test")
    after = test_errors(out / "best.model", stores["own"], "test")
    assert after.mae_energy_meV_per_atom < before.mae_energy_meV_per_atom
    assert after.mae_forces_meV_per_A < before.mae_forces_meV_per_A
    summary = json.loads((out / "summary.json").read_text())
    assert summary["e0s"]["method"].startswith("estimated")
    replay = pd.read_csv(out / "replay_mae.csv").set_index("when")
    # before: the foundation on mini's validation graphs (the E0 shift moves energies only)
    on_mini = test_errors(foundation, stores["mini"], "valid")
    assert replay.loc["before", "mae_forces_meV_per_A"] == pytest.approx(
        on_mini.mae_forces_meV_per_A, rel=1e-4)
    assert replay.loc["after", "graphs"] == on_mini.graphs
    assert replay.loc["after", "mae_forces_meV_per_A"] <= (
        REPLAY_BOUND * replay.loc["before", "mae_forces_meV_per_A"])
    assert summary["replay"]["after"]["graphs"] == on_mini.graphs
    mini_train = len(load_split(stores["mini"][1])["train"])
    own_train = len(load_split(stores["own"][1])["train"])
    assert summary["graphs"]["train"] == own_train + min(own_train, mini_train)


def nh3_store(folder: Path) -> tuple[Path, Path]:
    """Ammonia molecules: nitrogen, which mini (and so the foundation) never holds."""
    graphs = []
    for i in range(6):
        atoms = molecule("NH3")
        atoms.rattle(0.05, seed=i)
        atoms.calc = EMT()
        atoms.info["REF_energy"] = atoms.get_potential_energy()
        atoms.arrays["REF_forces"] = atoms.get_forces()
        graph = atoms_to_graph(atoms, CUTOFF)
        graph.pop("min_length")
        graphs.append({**graph, "source_index": i})
    return with_split(folder, graphs)


@pytest.mark.slow
def test_refusals_name_the_model_file_and_the_mismatch(stores, foundation, tmp_path, capsys):
    nh3 = nh3_store(tmp_path / "nh3")
    assert train(*nh3, tmp_path / "a", f"model.init_model={foundation}") == 2
    err = capsys.readouterr().err
    assert f"{foundation}: the model knows" in err and "holds N, which it does not" in err

    short = own_store(tmp_path / "short", cutoff=3.5)
    assert train(*short, tmp_path / "b", f"model.init_model={foundation}") == 2
    err = capsys.readouterr().err
    assert str(foundation) in err and "exceeds the graph" in err and "3.5" in err

    isolated = "model.e0s={Cu: 3.51, Ni: 4.44}"  # EMT's isolated atoms: another reference
    assert fine_tune(stores, foundation, tmp_path / "c", isolated, replay=False) == 2
    err = capsys.readouterr().err
    assert f"{foundation}: its E0s differ from those config model.e0s gives" in err
    assert "3.51 given" in err and "4.44 given" in err and "model.init_e0s" in err

    assert fine_tune(stores, foundation, tmp_path / "d", isolated, "model.init_e0s=data",
                     "epochs=1", replay=False) == 0
    e0s = json.loads((tmp_path / "d/summary.json").read_text())["e0s"]
    assert (e0s["eV"]["Cu"], e0s["eV"]["Ni"]) == pytest.approx((3.51, 4.44), abs=1e-6)
    assert e0s["method"].startswith("data")


DEFAULT = yaml.safe_load((REPO / "config/config.yaml").read_text())


def config_with(model: dict, e0s=None, cutoff: float = 4.5) -> dict:
    config = copy.deepcopy(DEFAULT)
    config["cutoff"] = cutoff
    config["datasets"]["cuni"] = {"kind": "files", "paths": [str(OWN)],
                                  "keys": {"forces": "force", "virial": "virial"},
                                  **({"e0s": e0s} if e0s else {})}
    config["model"] = {"datasets": ["cuni"], "ranks": 1, "settings": {}, "init_model": None,
                       "replay": None, **model}
    return config


@pytest.mark.slow
def test_plan_time_checks_name_the_key_and_the_file(foundation, tmp_path):
    def refused(config) -> str:
        with pytest.raises(ConfigError) as err:
            check_workflow_config(config)
        return str(err.value)

    check_workflow_config(config_with({"init_model": str(foundation)}))  # it passes
    assert "config model.init_model: nothing.model: no such file" in refused(
        config_with({"init_model": "nothing.model"}))
    differ = refused(config_with({"init_model": str(foundation)}, {"Cu": 3.51, "Ni": 4.44}))
    assert f"{foundation}: its E0s differ from those config datasets.cuni.e0s gives" in differ
    assert "init_e0s: foundation" in differ
    check_workflow_config(config_with({"init_model": str(foundation), "settings": {
        "model": {"init_e0s": "estimated"}}}, {"Cu": 3.51, "Ni": 4.44}))
    assert "exceeds the graphs' cutoff 3.5" in refused(
        config_with({"init_model": str(foundation)}, cutoff=3.5))
    assert "config model.replay: 'mini' replays" in refused(config_with({"replay": "mini"}))
    assert "fine-tune it in a second run" in refused(
        config_with({"init_model": "results/model/cuni/best.model"}))
    assert "config model.settings: config: unknown key 'epochz'" in refused(
        config_with({"settings": {"epochz": 3}}))
