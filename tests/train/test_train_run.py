"""`cfmtrain train` end to end on one rank: outputs, resume equivalence (interrupted at a step
inside an epoch, then resumed, gives the uninterrupted run's weights exactly), SIGTERM, and the
exported model in mace-torch's MACECalculator in a clean interpreter where cfmtrain is absent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import COMMON, REPO, train

from cfmtrain.kernels import isa


@pytest.fixture(scope="module")
def full_run(data, tmp_path_factory):  # overrides conftest's: the kernel variant here
    out = tmp_path_factory.mktemp("full")
    assert train(data[0], data[1], out, "variant=kernel") == 0
    return out


def test_outputs(full_run):
    summary = json.loads((full_run / "summary.json").read_text())
    for key in ("variant", "ranks", "epochs", "epoch_time_s", "final_train_loss",
                "val_mae_energy_per_atom", "val_mae_forces"):
        assert summary[key] is not None, key
    assert (summary["variant"], summary["ranks"], summary["epochs"]) == ("kernel", 1, 2)
    prov = summary["provenance"]
    assert prov["dtype"] == "float32" and prov["threads"] == 1
    assert "cpu-fused" in prov["kernel_backend"] and prov["packages"]["mace-torch"]
    assert prov["cpu_variant"] in {"generic", *isa.VARIANTS}  # the op libraries' build it ran
    # the product the fused ops' tiles ran on: AVX-512 exactly where this CPU has it
    assert prov["gemm"] == ("avx512" if "avx512f" in isa.cpu_flags() else "aten")
    epochs = (full_run / "epochs.csv").read_text().splitlines()
    assert len(epochs) == 3
    assert summary["epoch_time_s"] == pytest.approx(float(epochs[2].split(",")[1]))
    steps = pd.read_csv(full_run / "steps.csv")
    assert len(steps) == 2 * summary["steps_per_epoch"]
    # the training thread's CPU time beside wall time: positive, never above the wall time
    assert (steps.compute_cpu_s > 0).all() and (steps.cpu_s >= steps.compute_cpu_s).all()
    assert (steps.compute_cpu_s <= steps.compute_s + 1e-3).all()
    host = summary["host"]
    timed = steps[steps.epoch >= 1]
    assert host["cpu_time_s"] == pytest.approx(timed.compute_cpu_s.sum())
    assert host["wall_cpu_ratio"] == pytest.approx(timed.compute_s.sum()
                                                   / timed.compute_cpu_s.sum())
    assert host["loadavg_start"] >= 0 and host["steal_end"] >= host["steal_start"] >= 0
    assert host["cpu_total_end"] > host["cpu_total_start"]
    assert host["probe_start_s"] > 0 and host["probe_end_s"] > 0  # the speed probes
    table = (full_run / "test_mae.csv").read_text().splitlines()
    assert table[0].startswith("subset,graphs") and table[-1].startswith("all,")
    state = torch.load(full_run / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 2 and state["config"]["variant"] == "kernel"


@pytest.mark.slow
def test_eval_interval_skips_validations_only(data, tmp_path):
    """eval_interval=2 over 3 epochs validates after epochs 1 and 2 (the last), not 0: the same
    training and the same validation errors where both validate; the plateau scheduler steps
    only on validations."""
    runs = {k: tmp_path / f"every{k}" for k in (1, 2)}
    for k, out in runs.items():
        assert train(data[0], data[1], out, "variant=kernel", "epochs=3",
                     f"eval_interval={k}") == 0
    every, sparse = (pd.read_csv(runs[k] / "epochs.csv") for k in (1, 2))
    assert every.valid_loss.notna().all() and (every.valid_s > 0).all()
    assert sparse.valid_loss.isna().tolist() == [True, False, False]
    assert sparse.valid_s.tolist()[0] == 0 and (sparse.valid_s[1:] > 0).all()
    assert sparse.train_loss.tolist() == every.train_loss.tolist()
    cols = ["valid_loss", "valid_mae_energy_per_atom", "valid_mae_forces"]
    assert sparse[cols][1:].values.tolist() == every[cols][1:].values.tolist()
    summaries = [json.loads((runs[k] / "summary.json").read_text()) for k in (1, 2)]
    assert summaries[0]["val_mae_forces"] == summaries[1]["val_mae_forces"]
    states = [torch.load(runs[k] / "checkpoint.pt", weights_only=True) for k in (1, 2)]
    assert [s["scheduler"]["last_epoch"] for s in states] == [3, 2]
    for name, tensor in states[0]["model"].items():
        assert torch.equal(tensor, states[1]["model"][name]), name


@pytest.mark.slow
def test_resume_continues_in_sampler_order(data, full_run, tmp_path):
    steps_per_epoch = json.loads((full_run / "summary.json").read_text())["steps_per_epoch"]
    stop_at = steps_per_epoch + 2  # inside the second epoch
    assert train(data[0], data[1], tmp_path, "variant=kernel", f"max_steps={stop_at}") == 0
    assert not (tmp_path / "summary.json").exists()
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert (state["epoch"], state["batches_done"], state["global_step"]) == (1, 2, stop_at)
    assert train(data[0], data[1], tmp_path, "variant=kernel", "max_steps=0", resume="auto") == 0

    ref = torch.load(full_run / "checkpoint.pt", weights_only=True)
    got = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    for name, tensor in ref["model"].items():
        assert torch.equal(tensor, got["model"][name]), name
    for a, b in zip(ref["ema"]["shadow_params"], got["ema"]["shadow_params"], strict=True):
        assert torch.equal(a, b)
    assert ref["optimizer"]["state"].keys() == got["optimizer"]["state"].keys()
    for k, s in ref["optimizer"]["state"].items():
        assert all(torch.equal(s[f], got["optimizer"]["state"][k][f]) for f in s)
    cols = slice(0, 6)  # epoch, step, rank, graphs, atoms, edges
    rows = [[r.split(",")[cols] for r in (p / "steps.csv").read_text().splitlines()]
            for p in (full_run, tmp_path)]
    assert rows[0] == rows[1]
    losses = [pd.read_csv(p / "steps.csv").loss.tolist() for p in (full_run, tmp_path)]
    assert losses[0] == losses[1]
    assert json.loads((tmp_path / "summary.json").read_text())["resumed_epochs"] == [1]
    assert json.loads((full_run / "summary.json").read_text())["resumed_epochs"] == []


@pytest.mark.slow
def test_sigterm_writes_checkpoint_and_exits(data, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    args = [sys.executable, "-m", "cfmtrain.train", "--graphs", str(data[0]), "--split",
            str(data[1]), "--output", str(tmp_path), *[a for o in COMMON for a in ("--set", o)],
            "--set", "epochs=1000", "--variant", "both", "--set", "batch.capacity=40"]
    proc = subprocess.Popen(args, env={**env, "PYTHONWARNINGS": "ignore"}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    try:
        while not (tmp_path / "epochs.csv").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()
            time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    assert "stopped at global step" in output and "Traceback" not in output
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["global_step"] >= 1 and not (tmp_path / "summary.json").exists()


CALCULATOR = """
import importlib.util, json, sys
sys.path = [p for p in sys.path if not p.rstrip('/').endswith('/src')]
assert importlib.util.find_spec('cfmtrain') is None, 'cfmtrain importable'
import ase.io
from mace.calculators import MACECalculator
atoms = ase.io.read(sys.argv[2])
atoms.calc = MACECalculator(model_paths=sys.argv[1], device='cpu', default_dtype='float32')
print(json.dumps({'energy': atoms.get_potential_energy(), 'forces': atoms.get_forces().tolist()}))
"""


@pytest.mark.slow
def test_exported_model_runs_in_mace_calculator_without_cfmtrain(data, full_run, tmp_path):
    import ase.io
    from mace.tools.torch_geometric.dataloader import Collater

    from cfmtrain.batches.data import GraphDataset
    from cfmtrain.graphs.store import GraphStore
    from cfmtrain.train.model import z_table_of

    store, split, frames = data
    test_index = int(np.load(split)["test"][1])
    ase.io.write(tmp_path / "frame.xyz", frames[test_index])
    out = subprocess.run([sys.executable, "-I", "-c", CALCULATOR, str(full_run / "final.model"),
                          str(tmp_path / "frame.xyz")], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])

    model = torch.load(full_run / "final.model", weights_only=False)
    dataset = GraphDataset(GraphStore(store), np.array([test_index]), z_table_of(model),
                           float(model.r_max), torch.float32)
    pred = model(Collater([None], [None])([dataset[0]]).to_dict(), compute_force=True)
    assert got["energy"] == pytest.approx(float(pred["energy"][0]), rel=1e-5, abs=1e-5)
    np.testing.assert_allclose(got["forces"], pred["forces"].detach().numpy(), atol=1e-4)
