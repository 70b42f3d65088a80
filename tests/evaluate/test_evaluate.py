"""`cfmtrain evaluate`: a model's errors per config_type and overall are mace-torch's own
evaluation of the same model on the same frames (mace_eval_configs' predictions, the MAEs and
RMSEs computed from them here), from a graph store's test split and from an extxyz file of the
test frames alike; the parity plot is drawn from its table and the learning curves from
epochs.csv."""

from __future__ import annotations

import argparse
import subprocess
import sys

import ase.io
import numpy as np
import pandas as pd
import pytest

from cfmtrain.bench.baseline_check import export_extxyz
from cfmtrain.evaluate import cli
from cfmtrain.graphs.split import read_split
from cfmtrain.graphs.store import GraphStore


def evaluate(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.run(parser.parse_args([str(a) for a in argv]))


def mace_errors(predicted: list, kinds: list[str]) -> pd.DataFrame:
    """MAE and RMSE per config_type and over all, from mace_eval_configs' output frames (its
    MACE_* predictions beside the REF_* labels), in meV units."""
    rows = []
    for atoms, kind in zip(predicted, kinds, strict=True):
        n = len(atoms)
        d_e = (atoms.info["MACE_energy"] - atoms.info["REF_energy"]) / n
        d_f = atoms.arrays["MACE_forces"] - atoms.arrays["REF_forces"]
        d_s = (np.asarray(atoms.info["MACE_stress"]).reshape(3, 3)
               - np.asarray(atoms.info["REF_stress"]).reshape(3, 3)
               if "REF_stress" in atoms.info else None)
        rows.append((kind, n, d_e, d_f.ravel(), None if d_s is None else d_s.ravel()))
    out = {}
    for name in sorted({r[0] for r in rows}) + ["all"]:
        part = [r for r in rows if name in ("all", r[0])]
        e = np.array([r[2] for r in part])
        f = np.concatenate([r[3] for r in part])
        s = [r[4] for r in part if r[4] is not None]
        s = np.concatenate(s) if s else np.array([])
        out[name] = {"graphs": len(part), "atoms": sum(r[1] for r in part),
                     "mae_energy_meV_per_atom": 1000 * np.abs(e).mean(),
                     "rmse_energy_meV_per_atom": 1000 * np.sqrt(np.square(e).mean()),
                     "mae_forces_meV_per_A": 1000 * np.abs(f).mean(),
                     "rmse_forces_meV_per_A": 1000 * np.sqrt(np.square(f).mean()),
                     "stress_graphs": len(s) // 9,
                     "mae_stress_meV_per_A3": 1000 * np.abs(s).mean() if len(s) else np.nan,
                     "rmse_stress_meV_per_A3": (1000 * np.sqrt(np.square(s).mean())
                                                if len(s) else np.nan)}
    return pd.DataFrame.from_dict(out, orient="index")


@pytest.mark.slow
def test_errors_are_mace_torchs_own_evaluation(data, full_run, tmp_path):
    store_path, split, _ = data
    model = full_run / "final.model"
    assert evaluate("--model", model, "--graphs", store_path, "--split", split,
                    "--output", tmp_path / "evaluation.csv", "--epochs",
                    full_run / "epochs.csv") == 0
    ours = pd.read_csv(tmp_path / "evaluation.csv").set_index("config_type")

    store = GraphStore(store_path)
    test = read_split(split)[0]["test"]
    export_extxyz(store, test, tmp_path / "test.xyz")
    kinds = [store.subset_names[store.subsets[i]] for i in test]
    done = subprocess.run([sys.executable, "-m", "mace.cli.eval_configs", "--configs",
                           tmp_path / "test.xyz", "--model", model, "--output",
                           tmp_path / "mace.xyz", "--default_dtype", "float32",
                           "--compute_stress"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = mace_errors(ase.io.read(tmp_path / "mace.xyz", ":"), kinds)

    assert list(ours.index) == list(theirs.index) and len(ours) >= 3  # config_types, then all
    assert ours.loc["all", "stress_graphs"] > 0 and ours.loc["all", "graphs"] == len(test)
    for column in theirs.columns:
        np.testing.assert_allclose(ours[column].to_numpy(float), theirs[column].to_numpy(float),
                                   rtol=2e-5, atol=1e-6, err_msg=column)

    # the same frames from an extxyz file: the same errors over all graphs
    assert evaluate("--model", model, "--frames", tmp_path / "test.xyz",
                    "--output", tmp_path / "frames.csv") == 0
    frames = pd.read_csv(tmp_path / "frames.csv").set_index("config_type")
    for column in theirs.columns:
        np.testing.assert_allclose(frames.loc["all", column], theirs.loc["all", column],
                                   rtol=2e-5, atol=1e-6, err_msg=column)

    parity = pd.read_csv(tmp_path / "parity.csv")
    assert set(parity.quantity) == {"energy_per_atom", "force"}
    assert (parity.quantity == "energy_per_atom").sum() == len(test)
    for name in ("parity.png", "parity.pdf", "learning_curves.png", "learning_curves.pdf"):
        assert (tmp_path / name).stat().st_size > 1000, name


def test_errors_name_the_missing_model_and_an_empty_part(data, tmp_path, capsys):
    store_path, split, _ = data
    assert evaluate("--model", tmp_path / "none.model", "--graphs", store_path,
                    "--output", tmp_path / "e.csv") == 2
    assert "none.model: model file not found" in capsys.readouterr().err
    parts = dict(np.load(split))
    np.savez(tmp_path / "split.npz", **{**parts, "test": np.array([], np.int64)})
    import torch
    from helpers import small_model

    torch.save(small_model(), tmp_path / "m.model")
    assert evaluate("--model", tmp_path / "m.model", "--graphs", store_path, "--split",
                    tmp_path / "split.npz", "--output", tmp_path / "e.csv") == 2
    assert "split.npz: its test part holds no graphs" in capsys.readouterr().err
