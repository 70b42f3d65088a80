"""`cfmtrain bench gpu` (`make gpu-check`) run here on the CPU with the device as a parameter, so
that the GPU run is a rerun of tested code: every part with --force-device-parts (equality, the
paired train step, the four variants' trainings; CSV and figure), the CPU-only run that says
what it skipped, a failed check's exit code, its shapes are the tests', and the mini store it
builds."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cfmtrain.bench import gpu, gpu_equality
from cfmtrain.bench.gpu_training import mini_store
from cfmtrain.graphs.split import load_split
from cfmtrain.graphs.store import GraphStore
from cfmtrain.sources.mini import subset_counts


def bench_gpu(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cfmtrain", "bench", "gpu", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_every_part_runs_on_the_cpu_as_a_device(data, tmp_path):
    store, split = data[0], data[1]
    result = bench_gpu("--device", "cpu", "--force-device-parts", "--model", "tiny", "--atoms",
                       "16", "--rounds", "2", "--epochs", "2", "--graphs", str(store),
                       "--split", str(split), "--set", "threads=1",
                       "--set", "batch.graphs_per_batch=4", "--work", "work", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert gpu.SKIPPED not in result.stdout
    table = pd.read_csv(tmp_path / "results/bench/gpu_check.csv")
    assert list(table.columns) == list(gpu.COLUMNS)
    assert (table["torch"] == torch.__version__).all() and table["device"].str.startswith(
        "cpu").all()
    assert table["cuequivariance"].notna().all()
    checks = table[table["kind"] == "equality"]
    assert checks["ok"].all() and len(checks) == 4 + 4 + 8  # convs, quick contractions, models
    assert (checks["max_rel_err"] < checks["tolerance"]).all()
    step = table[table["kind"] == "train_step"]
    assert len(step) == 1 and step.iloc[0]["reference"] == "e3nn" and step.iloc[0][
        "candidate"] == "cueq" and step.iloc[0]["rounds"] == 2
    trained = table[table["kind"] == "training"]
    assert sorted(trained["candidate"]) == ["balancer", "both", "kernel"]
    assert (trained["reference"] == "baseline").all() and (trained["rounds"] == 1).all()
    ratios = table[table["kind"] != "equality"]
    assert (ratios["ratio_p10"] <= ratios["ratio_median"]).all()
    assert (ratios["ratio_median"] <= ratios["ratio_p90"]).all() and (ratios["ratio_median"] > 0
                                                                      ).all()
    for variant in ("baseline", "balancer", "kernel", "both"):
        assert (tmp_path / "work/group" / variant / "summary.json").is_file()
    assert (tmp_path / "results/figures/fig_gpu_check.png").stat().st_size > 10_000


@pytest.mark.slow
def test_without_a_gpu_it_checks_through_the_fallback_and_says_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    result = bench_gpu(cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == gpu.SKIPPED
    table = pd.read_csv(tmp_path / "results/bench/gpu_check.csv")
    assert (table["kind"] == "equality").all() and table["ok"].all()
    assert table["check"].str.startswith("tiny model").sum() == 8
    assert not (tmp_path / "results/figures").exists()


@pytest.mark.slow
def test_a_check_that_fails_makes_the_command_fail(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_equality, "CONV_SHAPES", gpu_equality.CONV_SHAPES[:1])
    monkeypatch.setattr(gpu_equality, "SC_SHAPES", gpu_equality.SC_SHAPES[:1])
    monkeypatch.setattr(gpu_equality, "CONV_TOLERANCE", 0.0)  # no difference is below 0
    parser = argparse.ArgumentParser()
    gpu.add_arguments(parser)
    args = parser.parse_args(["--device", "cpu", "--output", str(tmp_path / "out.csv"),
                              "--work", str(tmp_path)])
    assert gpu.run(args) == 1
    err = capsys.readouterr().err
    assert "cuEquivariance differs from e3nn in 1 check(s): conv 8x0e lmax 3" in err
    assert pd.read_csv(tmp_path / "out.csv")["ok"].tolist().count(False) == 1


@pytest.mark.slow
def test_it_builds_a_small_mini_once(tmp_path):
    store, split = mini_store(tmp_path / "mini", 0.02, 0)
    graphs = GraphStore(store)
    assert len(graphs) == sum(subset_counts(0.02).values())
    parts = load_split(split)
    assert sorted(np.concatenate([parts[k] for k in ("train", "valid", "test")]).tolist()) == \
        list(range(len(graphs)))
    stamp = (store / "shard_0000.h5").stat().st_mtime_ns
    assert mini_store(tmp_path / "mini", 0.02, 0) == (store, split)
    assert (store / "shard_0000.h5").stat().st_mtime_ns == stamp  # the same settings: kept
