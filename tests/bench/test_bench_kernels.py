"""`cfmtrain bench kernels`: the harness end to end on tiny configurations (rows, speedups, same
numbers, out-of-memory rows, matmul peak) and its helpers (FLOP counts: test_flops.py)."""

from __future__ import annotations

import argparse
import math
import time

import pandas as pd
import pytest
import torch

from cfmtrain.bench import kernels

SC = "symmetric_contraction"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    kernels.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.slow
def test_harness_end_to_end(tmp_path, monkeypatch):
    """Tiny model, 8 atoms: fused and mace rows of the symmetric contraction and of the conv
    (with the radial MLP's last layer) in float64 (train_step, double backward) and of the
    whole model in float32 (forces; the fused one
    from the run's model cache), plus one configuration far too big for a 2.5 GiB address
    space; each fused row's paired speed-up from 2 rounds. (GFLOP/s of op rows:
    test_add_speedups_and_differences.)"""
    monkeypatch.setitem(kernels.PRESETS, "test", {"reps": 5, "rounds": 2, "matrices": [
        {"ops": (SC, "conv"), "models": ("tiny",), "impls": ("fused", "mace"), "atoms": (8,),
         "dtypes": ("float64",), "passes": ("train_step",), "cg": ("original",)},
        {"ops": ("model",), "models": ("tiny",), "impls": ("mace", "fused"), "atoms": (8,),
         "dtypes": ("float32",), "passes": ("forward_backward",), "cg": ("original",)},
        {"ops": ("conv",), "models": ("tiny",), "impls": ("mace",), "atoms": (2000,),
         "dtypes": ("float64",), "passes": ("train_step",), "cg": ("original",)}]})
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the address space grows with threads' arenas
    csv, png = tmp_path / "kernels.csv", tmp_path / "kernels.png"
    args = _parse(["--preset", "test", "--output", str(csv), "--figure", str(png),
                   "--memory-limit-gb", "2.5", "--matmul-size", "512"])
    assert kernels.run(args) == 0
    rows = pd.read_csv(csv)
    assert len(rows) == 2 + 7 and png.stat().st_size > 0
    big = rows[rows["atoms"] == 2000]
    assert list(big["status"]) == ["oom"]
    rows = rows[rows["atoms"] != 2000]
    assert (rows["status"] == "ok").all(), rows[["op", "impl", "status"]]
    assert (rows["median_s"] > 0).all() and (rows["min_s"] <= rows["median_s"]).all()
    assert rows["peak_rss_mb"].between(50, 2560).all()
    peaks = rows[rows["impl"] == "matmul-peak"].set_index("dtype")
    assert sorted(peaks.index) == ["float32", "float64"]
    assert peaks["pct_of_matmul_peak"].tolist() == pytest.approx([100.0, 100.0])
    assert (peaks["gflop_s"] > 0).all()
    # the peak of the library the fused ops' products run on (kernels.dense)
    assert peaks.loc["float32", "backend"] == "oneDNN matmul 512x512"
    assert peaks.loc["float64", "backend"] == "torch.matmul 512x512"
    ops = rows[rows["impl"] != "matmul-peak"]
    for (op, dtype, kind), group in ops.groupby(["op", "dtype", "pass"]):
        fused, mace = (group[group["impl"] == i].iloc[0] for i in ("fused", "mace"))
        assert fused["speedup_vs_mace"] == pytest.approx(mace["median_s"] / fused["median_s"])
        assert mace["speedup_vs_mace"] == pytest.approx(1.0)
        # paired rounds (both arms in one process): on the fused row, against mace-torch
        assert fused["rounds"] == 2 and math.isnan(mace["ratio_median"])
        assert 0 < fused["ratio_p10"] <= fused["ratio_median"] <= fused["ratio_p90"]
        tolerance = 1e-10 if dtype == "float64" else 1e-4
        assert 0 <= fused["max_rel_diff_vs_mace"] < tolerance, (op, dtype, kind)
        assert mace["max_rel_diff_vs_mace"] == 0
        # FLOPs are counted on the fused rows, every pass (mace-torch's e3nn ops have none)
        assert fused["flops"] > 0 and math.isnan(mace["flops"]) and math.isnan(mace["gflop_s"])
        gflops = fused["flops"] / fused["median_s"] / 1e9
        assert fused["gflop_s"] == pytest.approx(gflops)
        assert fused["pct_of_matmul_peak"] == pytest.approx(
            100 * gflops / peaks.loc[dtype, "gflop_s"])


@pytest.mark.slow
def test_compiled_fused_model_forces_pass():
    """The compiled fused model's energy+forces row runs (with training=True, as MACECalculator
    runs a compiled model; training=False frees the forces' graph, which the compiled function's
    own backward trace then needs) and gives the eager fused model's forces."""
    import torch

    from cfmtrain.bench import kernels_worker

    config = {"op": "model", "model": "tiny", "cg": "original", "atoms": 16,
              "dtype": "float32", "pass": "forward_backward"}
    seen = {}
    for impl in ("fused", "fused_compile"):
        step, _ = kernels_worker.setup({**config, "impl": impl})
        seen[impl] = step(True)
    for name in ("interaction_energy", "forces"):
        torch.testing.assert_close(seen["fused_compile"][name], seen["fused"][name],
                                   rtol=1e-5, atol=1e-6)


def test_reps_below_five_refused(capsys):
    with pytest.raises(SystemExit):
        _parse(["--reps", "4"])
    assert "--reps: must be at least 5" in capsys.readouterr().err
    with pytest.raises(ValueError, match="at least 5"):
        kernels._configs(argparse.Namespace(preset="quick", reps=4))


def test_configs_of_presets_and_overrides():
    configs = kernels._configs(_parse(["--preset", "quick"]))
    peaks = [c for c in configs if c["impl"] == "matmul-peak"]
    assert [c["dtype"] for c in peaks] == ["float32"] and configs[0] == peaks[0]
    rest = configs[1:]
    assert len(rest) == 3 * 2 and {c["op"] for c in rest} == set(kernels.OPS)
    assert all(c["atoms"] == 96 and c["model"] == "paper" and c["reps"] == 5 for c in rest)
    picked = kernels._configs(_parse(["--ops", "conv", "--atoms", "8", "12", "--dtypes",
                                      "float32", "float64", "--reps", "7"]))
    assert len(picked) == 2 + 2 * 2 * 2 and all(c["reps"] == 7 for c in picked)
    goals = kernels._configs(_parse(["--preset", "goals", "--ops", "conv", "model"]))
    assert [(c["op"], c["impl"]) for c in goals[1:]] == [
        ("conv", "fused"), ("conv", "mace"), ("model", "fused"), ("model", "mace"),
        ("model", "fused_compile")]  # no conv row compiled as a whole model
    full = kernels._configs(_parse(["--preset", "full"]))
    assert len(full) == len({tuple(sorted(c.items(), key=str)) for c in full})  # no duplicates
    covered = {(c["op"], c["impl"], c["atoms"], c["dtype"], c["pass"], c["cg"]) for c in full
               if c["impl"] != "matmul-peak"}
    for axis, values in ((2, {200, 800, 3072}), (3, {"float32", "float64"}),
                         (4, set(kernels.PASSES)), (5, {"original", "reduced"}),
                         (1, {"fused", "mace", "compile"})):
        assert {c[axis] for c in covered} == values


def test_add_speedups_and_differences():
    def row(impl, median, prints, op=SC, kind="forward", status="ok", flops=2e9):
        return {"op": op, "model": "paper", "cg": "original", "impl": impl, "atoms": 8,
                "dtype": "float32", "pass": kind, "status": status, "median_s": median,
                "fingerprint": prints, "flops": flops}

    rows = [row("matmul-peak", 0.1, {}, op="matmul", flops=4e10),
            row("mace", 2.0, {"out": [10.0, 3.0], "g": [2.0, -1.0]}, flops=None),
            row("fused", 0.5, {"out": [10.0, 3.001], "g": [2.0, -1.0]}),
            row("compile", 1.0, {"out": [10.0, 3.0]}, flops=None),
            row("fused", 0.5, {"out": [1.0, 1.0]}, kind="train_step", flops=None),
            row("fused", 1.0, {}, op="conv", status="oom"),
            row("fused", 0.25, {}, kind="train_step", flops=6e9)]
    kernels._add_speedups(rows)
    peak, mace, fused, compiled, lone, oom, counted = rows
    assert peak["gflop_s"] == pytest.approx(400.0) and peak["pct_of_matmul_peak"] == 100
    assert fused["speedup_vs_mace"] == 4.0 and mace["speedup_vs_mace"] == 1.0
    assert fused["max_rel_diff_vs_mace"] == pytest.approx(1e-4)
    assert mace["max_rel_diff_vs_mace"] == 0.0
    assert math.isnan(compiled["max_rel_diff_vs_mace"])  # other tensors: not comparable
    assert compiled["speedup_vs_mace"] == 2.0
    assert fused["gflop_s"] == pytest.approx(4.0) and fused["pct_of_matmul_peak"] == 1.0
    assert math.isnan(lone["speedup_vs_mace"]) and math.isnan(lone["gflop_s"])
    assert math.isnan(oom["speedup_vs_mace"]) and math.isnan(oom["gflop_s"])
    assert math.isnan(mace["gflop_s"])  # no count: no rate
    assert counted["gflop_s"] == pytest.approx(24.0) and counted["pct_of_matmul_peak"] == 6.0


def test_time_step_times_only_the_calls_after_the_warm_up():
    """The first call and WARMUP_CALLS more (TorchScript's profiling executor optimises over
    them) stay out of the timed calls: a step slow on its first calls times as its later ones."""
    from cfmtrain.bench import WARMUP_CALLS
    from cfmtrain.bench.kernels_worker import time_step

    calls = []

    def step(record: bool = False):
        calls.append(record)
        if len(calls) <= 1 + WARMUP_CALLS:
            time.sleep(0.05)  # the first calls are slow
        return {"out": torch.ones(2)} if record else None

    result = time_step(step, reps=3)
    assert calls == [True] + [False] * (WARMUP_CALLS + 3)
    assert len(result["times"]) == 3 and max(result["times"]) < 0.04
    assert result["compile_s"] >= 0.05
