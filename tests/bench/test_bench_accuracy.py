"""`cfmtrain bench accuracy`: the time-to-accuracy logic on hand-made curves, mace_run_train's
log times, the extra epochs of a run short of the target (logic with fake runs, and a real
resumed cfmtrain run), and the whole benchmark (cfmtrain baseline and both, mace_run_train) on a
tiny store with a tiny model for 2 epochs."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ase.build import bulk
from ase.calculators.emt import EMT
from helpers import CUTOFF, TINY, emt_frames, make_store

from cfmtrain.bench import accuracy
from cfmtrain.bench.accuracy_runs import (
    CURVE_FIELDS,
    MACE,
    MACE_NAME,
    Bench,
    RunResult,
    log_stamps,
    mace_curve,
    mace_process,
    mace_result,
    mace_times,
    run_cfmtrain,
)
from cfmtrain.graphs.build import atoms_to_graph
from cfmtrain.graphs.store import GraphStore, write_shard
from cfmtrain.measure.paired import run_rounds
from cfmtrain.train.build import load_parts, training_stats
from cfmtrain.train.config import load_config, validate


@pytest.mark.parametrize("mae, target, expected", [
    ([10.0, 6.0, 2.0], 4.0, (15.0, 20.0, 3)),  # halfway between epochs 2 and 3 (10 s, 20 s)
    ([10.0, 6.0, 2.0], 6.0, (10.0, 10.0, 2)),  # exactly at epoch 2
    ([3.0, 6.0, 2.0], 5.0, (5.0, 5.0, 1)),  # the first epoch already: its time
    ([10.0, 6.0, 2.0], 1.0, (math.nan, math.nan, 0)),  # never
    ([10.0, 8.0, 9.0, 1.0], 8.5, (8.75, 10.0, 2)),  # the first crossing counts
])
def test_time_to_reach(mae, target, expected):
    wall = [5.0, 10.0, 20.0, 30.0][:len(mae)]
    got = accuracy.time_to_reach(np.array(wall), np.array(mae), target)
    np.testing.assert_allclose(got, expected)


def curve(run: str, walls: list[float], maes: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"run": run, "epoch": range(len(walls)), "wall_s": walls,
                         "valid_mae_e_meV_per_atom": [2 * m for m in maes],
                         "valid_mae_f_meV_per_A": maes})


def rounds_of(seed: int, epochs: dict[str, list[float]]) -> pd.DataFrame:
    """round_rows of paired rounds whose runs' epochs took `epochs` seconds."""
    queues = {run: iter(times) for run, times in epochs.items()}
    arms = {run: (lambda q=queue: next(q)) for run, queue in queues.items()}
    rounds = run_rounds(arms, len(next(iter(epochs.values()))), seed=seed)
    return accuracy.round_rows(rounds).assign(seed=seed)


def test_summary_ratios_and_goals():
    curves = pd.concat([curve(MACE, [10, 20, 30, 40], [80, 60, 50, 40]),
                        curve("baseline", [12, 24, 36, 48], [70, 55, 45, 44]),  # never 40
                        curve("both", [2, 4, 6, 8], [60, 45, 35, 30])])  # 40 at 5 s
    infos = {r: {"steps_per_epoch": 5, "process_wall_s": 60.0} for r in accuracy.RUNS}
    infos["baseline"]["data_wait_pct"], infos["both"]["data_wait_pct"] = 1.0, 6.0
    summary = accuracy.summarize(curves, infos).assign(seed=0).set_index("run")
    assert summary.loc[MACE, "time_to_target_s"] == 40 and summary.loc[MACE, "speedup"] == 1
    assert summary.loc["both", "time_to_target_s"] == pytest.approx(5.0)
    assert summary.loc["both", "time_to_target_epoch_s"] == 6
    assert summary.loc["both", "speedup"] == pytest.approx(8.0)
    assert not summary.loc["baseline", "reached"]
    assert math.isnan(summary.loc["baseline", "speedup"])
    assert summary.loc["baseline", "mae_f_ratio"] == pytest.approx(44 / 40)
    assert summary.loc["both", "mae_e_ratio"] == pytest.approx(30 / 40)
    assert summary.loc["both", "epoch_s"] == 2 and summary.loc[MACE, "epoch_s"] == 10
    rounds = rounds_of(0, {MACE: [10, 12, 8, 10], "baseline": [12, 15, 10, 12],
                           "both": [2, 2.4, 1.6, 2]})
    lines = accuracy.goal_lines(summary.reset_index(), rounds)
    assert "both: epoch time in paired rounds: 5.00x mace_run_train's (5.00-5.00, 10-90% of " \
           "4 rounds)" in lines
    assert any(line.startswith("baseline: epoch time in paired rounds: 0.82x") for line in lines)
    assert "baseline: time to mace_run_train's final force MAE: reached in 0 of 1 seeds" in lines[0]
    assert "both: time to mace_run_train's final force MAE: 5.0 s, 8.00x" in lines[1]
    assert not any("noise floor" in line for line in lines)  # one seed: no spread to state
    assert lines[-3].endswith(": met") and lines[-1].endswith("worst 1.100): met")
    assert lines[-2].endswith("step time: not met (worst 6.00%)")
    assert "both against baseline after 4 epochs: MAE E 0.682x, F 0.682x" in lines  # 30 / 44


def test_overall_takes_medians_over_seeds():
    rows = []
    # (seed, run, MAE E, MAE F, speedup, reached)
    for seed, run, e, f, speedup in [(0, MACE, 100, 50, 1.0), (1, MACE, 140, 60, 1.0),
                                     (2, MACE, 120, 55, 1.0),
                                     (0, "both", 110, 52, 3.5), (1, "both", 150, 70, 2.5),
                                     (2, "both", 100, 50, 3.1),
                                     (0, "baseline", 130, 49, 0.8),
                                     (1, "baseline", 90, 58, math.nan),
                                     (2, "baseline", 160, 66, 0.7)]:
        ref = {0: (100, 50), 1: (140, 60), 2: (120, 55)}[seed]
        rows.append({"seed": seed, "run": run, "equal_epochs": 5, "steps_per_epoch": 10,
                     "data_wait_pct": 0.5 if run != MACE else math.nan,
                     "mae_e_meV_per_atom": e, "mae_f_meV_per_A": f,
                     "mae_e_ratio": e / ref[0], "mae_f_ratio": f / ref[1],
                     "speedup": speedup, "reached": not math.isnan(speedup),
                     "time_to_target_s": 100 / speedup, "epoch_s": 10.0 + seed})
    summary = pd.DataFrame(rows)
    rounds = pd.concat([  # both's epochs over the seeds' rounds: 5x, 4x and 6x mace's
        rounds_of(0, {MACE: [10.0], "baseline": [12.5], "both": [2.0]}),
        rounds_of(1, {MACE: [12.0], "baseline": [15.0], "both": [3.0]}),
        rounds_of(2, {MACE: [10.0], "baseline": [12.5], "both": [10 / 6]})])
    total = accuracy.overall(summary, rounds).set_index("run")
    assert total.loc["both", ["ratio_median", "ratio_p10", "ratio_p90", "rounds"]].tolist() == \
        pytest.approx([5.0, 4.2, 5.8, 3])
    assert total.loc["baseline", "ratio_median"] == pytest.approx(0.8)
    assert total.loc[MACE, "ratio_median"] == 1
    assert total.loc["both", "speedup"] == pytest.approx(3.1)  # median of 3.5, 2.5, 3.1
    assert (total.loc["both", "speedup_min"], total.loc["both", "speedup_max"]) == (2.5, 3.5)
    # a seed that never reached the target counts as the slowest: median of 0.8, never, 0.7
    assert total.loc["baseline", "speedup"] == pytest.approx(0.7)
    assert total.loc["baseline", "reached"] == 2 and total.loc["both", "reached"] == 3
    # ratio of the medians (110 / 120), not the median of the per-seed ratios
    assert total.loc["both", "mae_e_ratio"] == pytest.approx(110 / 120)
    assert total.loc["both", "mae_e_ratio_max"] == pytest.approx(110 / 100)  # seed 0
    assert total.loc["baseline", "mae_f_ratio"] == pytest.approx(58 / 55)
    assert total.loc[MACE, "mae_e_spread"] == pytest.approx((140 - 100) / 120)
    assert total.loc[MACE, "epoch_s"] == 11.0
    lines = accuracy.goal_lines(summary, rounds)
    assert "over 3 seeds" in lines[1] and "reached in 2 of 3 seeds" in lines[0]
    assert any(line.startswith("noise floor: mace_run_train's own MAEs after 5 epochs vary "
                               "over the seeds by 33% (E)") for line in lines)
    assert lines[-3].endswith("(median over the seeds): met")
    assert lines[-1].endswith(": met") and "worst 1.083" in lines[-1]  # baseline E: 130 / 120
    # medians: both E 110, F 52; baseline E 130, F 58
    assert ("both against baseline after 5 epochs: MAE E 0.846x, F 0.897x (medians over the "
            "seeds)") in lines


def test_mace_log_times_and_curve(tmp_path):
    log = tmp_path / "mace.log"
    log.write_text("2026-01-01 10:00:00.000 INFO: Started training\n"
                   "2026-01-01 10:00:01.500 INFO: Initial: head: Default, loss=1\n"
                   "2026-01-01 10:00:04.000 INFO: Epoch 0: head: Default, loss=1\n"
                   "2026-01-01 10:01:01.750 INFO: Epoch 1: head: Default, loss=1\n")
    stamps = log_stamps(log)
    start = stamps[None]
    assert {k: v - start for k, v in stamps.items()} == {None: 0.0, 0: 2.5, 1: 60.25}
    assert mace_times(stamps) == {0: 2.5, 1: 60.25}
    # stopped for 20 s during epoch 1 (and before training started): not its time
    stops = [(start - 5, start - 1), (start + 30, start + 50)]
    times = mace_times(stamps, stops)
    assert times == pytest.approx({0: 2.5, 1: 40.25})
    records = [{"mode": "eval", "epoch": None, "mae_e_per_atom": 1.0, "mae_f": 1.0},
               {"mode": "eval", "epoch": 0, "mae_e_per_atom": 0.02, "mae_f": 0.3},
               {"mode": "eval", "epoch": 1, "mae_e_per_atom": 0.01, "mae_f": 0.2}]
    got = mace_curve(records, times)
    assert list(got.columns) == list(CURVE_FIELDS) and list(got.epoch) == [0, 1]
    np.testing.assert_allclose(got.wall_s, [2.5, 40.25])
    np.testing.assert_allclose(got.valid_mae_f_meV_per_A, [300, 200])
    np.testing.assert_allclose(got.valid_mae_e_meV_per_atom, [20, 10])
    with pytest.raises(ValueError, match="Initial"):
        mace_times({0: start})


def fake_run(run: str, maes: list[float], **info) -> RunResult:
    return RunResult(curve(run, [10.0 * (k + 1) for k in range(len(maes))], maes),
                     {"steps_per_epoch": 3, "process_wall_s": 1.0, "e0s": {29: 0.5}, "stops": [],
                      "capacity": {"source": "auto", "value": 40}, **info})


EPOCH_S = {MACE: 10.0, "baseline": 12.5, "both": 2.0}  # the fake runs' epochs in paired rounds


def fake_paired(calls: list, maes_of):
    """A train_paired that records its call and returns fake runs with the E0s given and
    `maes_of(bench, run)` as their curves, in paired rounds of EPOCH_S."""
    def train_paired(bench, store, parts, e0s, variants):
        calls.append((bench.cfg.seed, "paired", bench.cfg.epochs, bench.work.name))
        results = {run: fake_run(run, maes_of(bench, run), data_wait_pct=1.0)
                   for run in (*variants, MACE)}
        for result in results.values():
            result.info["e0s"] = dict(e0s)
        arms = {run: (lambda t=EPOCH_S[run]: t) for run in results}
        return results, run_rounds(arms, bench.cfg.epochs, seed=bench.cfg.seed)
    return train_paired


def test_extra_epochs_resume_only_runs_short_of_the_target(tmp_path, monkeypatch):
    store, split, _ = make_store(tmp_path / "store", n=12)
    maes = {"baseline": [90.0, 80.0, 70.0, 60.0], "both": [90.0, 50.0, 45.0],
            MACE: [70.0, 55.0]}
    calls = []

    def run_cfmtrain(bench, variant, epochs, resume=False, stops=()):
        calls.append((variant, epochs, resume))
        return fake_run(variant, maes[variant][:epochs], data_wait_pct=1.5,
                        e0s=bench.cfg.model.e0s)

    monkeypatch.setattr(accuracy, "run_cfmtrain", run_cfmtrain)
    monkeypatch.setattr(accuracy, "train_paired",
                        fake_paired(calls, lambda bench, run: maes[run][:bench.cfg.epochs]))
    parser = argparse.ArgumentParser()
    accuracy.add_arguments(parser)
    out = tmp_path / "bench"
    assert accuracy.run(parser.parse_args([
        "--graphs", str(store), "--split", str(split), "--epochs", "2", "--extra-epochs", "2",
        "--name", "fake", "--output-dir", str(out), "--figure", str(tmp_path / "f.png")])) == 0
    assert calls == [(0, "paired", 2, "seed0"), ("baseline", 3, True),
                     ("baseline", 4, True)]  # both reached 55 at epoch 2; baseline never
    curves = pd.read_csv(out / "accuracy_fake.csv")
    assert curves.groupby("run").size().to_dict() == {"baseline": 4, "both": 2, MACE: 2}
    summary = pd.read_csv(out / "accuracy_fake_summary.csv").set_index("run")
    assert summary.loc["baseline", "process_wall_s"] == 3.0  # three processes
    assert (summary.epochs.to_dict(), summary.equal_epochs.unique().tolist()) == (
        {"baseline": 4, "both": 2, MACE: 2}, [2])
    assert summary.loc["baseline", "mae_f_ratio"] == pytest.approx(80 / 55)
    assert not summary.loc["baseline", "reached"]
    assert summary.loc["both", "time_to_target_s"] == pytest.approx(10 + 10 * 35 / 40)
    # the paired rounds: two, one epoch of each run per round, the speed-ups per round
    rounds = pd.read_csv(out / "accuracy_fake_rounds.csv")
    assert sorted(rounds.groupby("round").run.apply(sorted).tolist()) == [sorted(EPOCH_S)] * 2
    assert summary.loc["both", ["ratio_median", "ratio_p10", "ratio_p90", "rounds"]].tolist() \
        == pytest.approx([5.0, 5.0, 5.0, 2])
    overall = pd.read_csv(out / "accuracy_fake_overall.csv").set_index("run")
    assert overall.loc["baseline", "ratio_median"] == pytest.approx(0.8)


def test_fixed_e0s_are_held_and_every_run_gets_a_valid_config(tmp_path, monkeypatch):
    """A fit with some elements held (a union whose member gives isolated-atom energies, as the
    real-DFT race's ethanol does): the E0s are fitted once, with the held ones kept, and the runs'
    config (which then carries the fitted mapping) passes the checks `cfmtrain train` makes."""
    store, split, _ = make_store(tmp_path / "store", n=12)
    seen = []

    def train_paired(bench, store, parts, e0s, variants):
        seen.append((validate(bench.cfg).model.e0s, dict(e0s)))
        return fake_paired([], lambda bench, run: [50.0])(bench, store, parts, e0s, variants)

    monkeypatch.setattr(accuracy, "train_paired", train_paired)
    parser = argparse.ArgumentParser()
    accuracy.add_arguments(parser)
    assert accuracy.run(parser.parse_args([
        "--graphs", str(store), "--split", str(split), "--epochs", "1", "--extra-epochs", "0",
        "--set", "model.e0s=fit", "--set", 'model.e0s_fixed={"Cu": -3.25}', "--name", "fixed",
        "--output-dir", str(tmp_path / "bench"), "--figure", str(tmp_path / "f.png")])) == 0
    (given, e0s), = seen
    assert given == e0s and e0s[29] == -3.25 and sorted(e0s) == [28, 29]


@pytest.mark.slow
def test_cfmtrain_run_resumes_for_an_extra_epoch(tmp_path):
    store, split, _ = make_store(tmp_path / "store", n=12)
    cfg = load_config(None, [*TINY, "batch.graphs_per_batch=3", "measure_straggler=false"])
    bench = Bench(cfg=cfg, graphs=[store], split=split, ranks=1, threads=1, work=tmp_path)
    first = run_cfmtrain(bench, "both", 1)
    more = run_cfmtrain(bench, "both", 2, resume=True)
    assert list(first.curve.epoch) == [0] and list(more.curve.epoch) == [0, 1]
    assert more.curve.wall_s.iloc[0] == first.curve.wall_s.iloc[0] < more.curve.wall_s.iloc[1]
    assert more.info["e0s"] == first.info["e0s"]
    log = (tmp_path / "both.log").read_text()
    assert log.count("cfmtrain launch") == 2 and "resuming at epoch 1" in log


def aluminium_only_in_test(folder: Path) -> tuple[Path, Path]:
    """A store of 12 Cu/Ni graphs (9 train, 3 valid) and 3 aluminium cells, the test part
    alone, with its split."""
    frames = emt_frames(12, seed=4)
    for k in range(3):
        atoms = bulk("Al", "fcc", a=4.05, cubic=True)
        atoms.rattle(0.04, seed=k)
        atoms.calc = EMT()
        atoms.info.update(REF_energy=atoms.get_potential_energy(), config_type="al")
        atoms.info["REF_stress"] = atoms.get_stress(voigt=False)
        atoms.arrays["REF_forces"] = atoms.get_forces()
        atoms.calc = None
        frames.append(atoms)
    graphs = [atoms_to_graph(a, CUTOFF) | {"source_index": i} for i, a in enumerate(frames)]
    folder.mkdir(parents=True)
    write_shard(folder / "shard_0000.h5", graphs, cutoff=CUTOFF)
    split = folder / "split.npz"
    np.savez(split, seed=0, store=GraphStore(folder).fingerprint, train=np.arange(9),
             valid=np.arange(9, 12), test=np.arange(12, 15))
    return folder, split


@pytest.mark.slow
def test_mace_run_train_builds_the_element_table_of_the_e0s(tmp_path):
    """An element of the store that neither mace_run_train's training nor its validation file
    holds (aluminium, in the test part only): the E0s every run gets cover it, and
    mace_run_train's model is built on their elements, as cfmtrain's are, instead of failing
    on the shapes of E0s beyond the elements of its files."""
    folder, split = aluminium_only_in_test(tmp_path / "store")
    store = GraphStore(folder)
    cfg = load_config(None, [*TINY, "batch.graphs_per_batch=3", "measure_straggler=false",
                             "epochs=1", "eval_interval=1"])
    parts = load_parts(store, split, cfg)
    stats = training_stats(cfg, store, parts)
    e0s = dict(zip(stats.zs, stats.e0s, strict=True))
    assert sorted(e0s) == [13, 28, 29]
    bench = Bench(cfg=cfg, graphs=[folder], split=split, ranks=1, threads=1,
                  work=tmp_path / "work")
    bench.work.mkdir()
    with mace_process(bench, store, parts, e0s) as process:
        process.finish()
    got = mace_result(bench, process).info["e0s"]
    assert sorted(got) == sorted(e0s)
    np.testing.assert_allclose([got[z] for z in sorted(e0s)], [e0s[z] for z in sorted(e0s)],
                               atol=1e-6)


@pytest.mark.slow
def test_bench_end_to_end(tmp_path):
    store, split, _ = make_store(tmp_path / "store", n=24)
    parser = argparse.ArgumentParser()
    accuracy.add_arguments(parser)
    out = tmp_path / "bench"
    args = parser.parse_args([
        "--graphs", str(store), "--split", str(split), "--preset", "quick", "--epochs", "2",
        "--ranks", "2", "--threads", "2", "--graphs-per-batch", "3", "--extra-epochs", "0",
        "--name", "tiny",
        "--output-dir", str(out), "--figure", str(tmp_path / "fig.png"),
        *[a for s in TINY for a in ("--set", s)]])
    assert accuracy.run(args) == 0
    curves = pd.read_csv(out / "accuracy_tiny.csv")
    assert list(curves.columns) == ["seed", *CURVE_FIELDS] and set(curves.seed) == {0}
    assert sorted(map(tuple, curves[["run", "epoch"]].to_numpy().tolist())) == sorted(
        (r, e) for r in accuracy.RUNS for e in (0, 1))
    assert np.isfinite(curves.select_dtypes("number").to_numpy()).all()
    assert (curves.groupby("run").wall_s.diff().dropna() > 0).all()
    # mace_run_train's final MAEs are its own, from its results file
    results = (out / "accuracy_tiny" / "seed0" / MACE / "results"
               / f"{MACE_NAME}_run-0_train.txt")
    final = [r for r in map(json.loads, results.read_text().splitlines())
             if r["mode"] == "eval" and r["epoch"] == 1][0]
    last = curves[(curves.run == MACE) & (curves.epoch == 1)].iloc[0]
    assert last.valid_mae_f_meV_per_A == pytest.approx(1000 * final["mae_f"])
    assert last.valid_mae_e_meV_per_atom == pytest.approx(1000 * final["mae_e_per_atom"])
    summary = pd.read_csv(out / "accuracy_tiny_summary.csv").set_index("run")
    assert list(summary.index) == list(accuracy.RUNS)
    np.testing.assert_allclose(summary.target_mae_f_meV_per_A, 1000 * final["mae_f"])
    assert summary.loc[MACE, "speedup"] == 1 and summary.loc[MACE, "mae_f_ratio"] == 1
    assert (summary.steps_per_epoch > 0).all()
    waits = summary.data_wait_pct  # cfmtrain's share of step time waiting for data
    assert 0 < waits["baseline"] < 100 and 0 < waits["both"] < 100 and np.isnan(waits[MACE])
    record = json.loads((out / "accuracy_tiny.json").read_text())["per_seed"][0]
    assert record["e0s_max_abs_diff_eV"] < 1e-6 and record["mace_batch_size"] == 6
    # paired rounds: each a shuffled order of the three runs' epochs, the processes (torchrun's
    # ranks too) waiting stopped meanwhile; the speed-ups are those of the rounds' epochs
    rounds = pd.read_csv(out / "accuracy_tiny_rounds.csv")
    runs = sorted(accuracy.RUNS)
    assert sorted(rounds.groupby("round").run.apply(sorted).tolist()) == [runs] * 2
    assert (summary.stopped_s > 0).all() and (summary["rounds"] == 2).all()
    for run in accuracy.RUNS:  # each round's epoch is the run's own (its curve's) epoch
        epoch_s = np.diff(np.concatenate([[0], curves[curves.run == run].wall_s]))
        np.testing.assert_allclose(rounds[rounds.run == run].sort_values("round").epoch_s,
                                   epoch_s)
    times = rounds.pivot(index="round", columns="run", values="epoch_s")
    np.testing.assert_allclose(summary.loc["both", "ratio_median"],
                               np.median(times[MACE] / times["both"]))
    # batch.capacity auto (the default): both takes as many optimiser steps as the baseline
    assert record["capacity"]["source"] == "auto"
    steps = summary.steps_per_epoch
    assert steps["both"] <= steps["baseline"] == record["capacity"]["baseline_steps"]
    assert steps["both"] >= 0.9 * steps["baseline"]
    assert (tmp_path / "fig.png").stat().st_size > 0 and (tmp_path / "fig.pdf").exists()
    for variant in ("baseline", "both"):  # no warm-up: first-touch costs timed, as mace-torch's
        log = (out / "accuracy_tiny" / "seed0" / f"{variant}.log").read_text()
        assert "cfmtrain launch" in log and "memory warm-up" not in log
        assert "not validated" not in log  # a curve point per epoch whatever the cells use


def test_several_seeds_train_each_triple_and_write_the_overall_table(tmp_path, monkeypatch):
    store, split, _ = make_store(tmp_path / "store", n=12)
    calls = []

    def maes(bench, run):
        return [70.0, 50.0 + bench.cfg.seed] if run == MACE else [60.0 - bench.cfg.seed, 40.0]

    monkeypatch.setattr(accuracy, "train_paired", fake_paired(calls, maes))
    parser = argparse.ArgumentParser()
    accuracy.add_arguments(parser)
    out = tmp_path / "bench"
    argv = ["--graphs", str(store), "--split", str(split), "--epochs", "2", "--seeds", "3", "4",
            "--name", "two", "--output-dir", str(out), "--figure", str(tmp_path / "f.png")]
    assert accuracy.run(parser.parse_args(argv)) == 0
    assert calls == [(3, "paired", 2, "seed3"), (4, "paired", 2, "seed4")]
    summary = pd.read_csv(out / "accuracy_two_summary.csv")
    assert sorted(zip(summary.seed, summary.run, strict=True)) == sorted(
        (s, r) for s in (3, 4) for r in accuracy.RUNS)
    seed4 = summary[summary.seed == 4].set_index("run")
    assert seed4.loc["both", "target_mae_f_meV_per_A"] == 54.0  # its own seed's mace_run_train
    total = pd.read_csv(out / "accuracy_two_overall.csv").set_index("run")
    assert (total.seeds == 2).all() and total.loc[MACE, "mae_f_meV_per_A"] == 53.5
    assert total.loc["both", "mae_f_ratio"] == pytest.approx(40 / 53.5)
    record = json.loads((out / "accuracy_two.json").read_text())
    assert record["seeds"] == [3, 4] and [f["seed"] for f in record["per_seed"]] == [3, 4]
    assert any("noise floor" in line for line in record["goals"])
    rounds = pd.read_csv(out / "accuracy_two_rounds.csv")  # 2 seeds x 2 rounds x 3 runs
    assert len(rounds) == 12 and set(rounds.seed) == {3, 4} and total.loc["both", "rounds"] == 4
    # a rerun takes the finished seeds as they are; other settings train them again
    first = pd.read_csv(out / "accuracy_two_summary.csv")
    calls.clear()
    assert accuracy.run(parser.parse_args([*argv, "--seeds", "4", "3", "5"])) == 0
    assert calls == [(5, "paired", 2, "seed5")]
    again = pd.read_csv(out / "accuracy_two_summary.csv")
    pd.testing.assert_frame_equal(again[again.seed != 5].sort_values(["seed", "run"])
                                  .reset_index(drop=True),
                                  first.sort_values(["seed", "run"]).reset_index(drop=True))
    calls.clear()
    assert accuracy.run(parser.parse_args([*argv, "--extra-epochs", "1"])) == 0
    assert [c[0] for c in calls] == [3, 4]
    twice = [a if a != "4" else "3" for a in argv]  # --seeds 3 3: refused before training
    with pytest.raises(SystemExit, match="repeats a seed"):
        accuracy.run(parser.parse_args(twice))


def test_mace_arguments_carry_the_model_settings(tmp_path):
    """The model target's recipe in mace_run_train's words: stage two from cfmtrain's epoch with
    its weights and lr, the stress loss, early stopping and the plateau's patience."""
    from cfmtrain.bench.baseline_check import mace_arguments
    from cfmtrain.train import presets

    cfg = load_config(base=presets.model_settings({"epochs": 8}))
    words = mace_arguments(cfg, 4.5, tmp_path)
    for word in ("--stage_two", "--start_stage_two=6", "--stage_two_lr=0.001",
                 "--stage_two_energy_weight=1000.0", "--stage_two_forces_weight=100.0",
                 "--stage_two_stress_weight=10.0", "--loss=stress", "--stress_weight=1.0",
                 "--compute_stress=True", "--patience=30", "--scheduler_patience=10",
                 "--ema_decay=0.99", "--hidden_irreps=128x0e+128x1o", "--max_ell=3"):
        assert word in words, word
    plain = mace_arguments(load_config(), 4.5, tmp_path)
    assert not any(w.startswith(("--stage_two", "--loss=stress", "--patience")) for w in plain)


@pytest.mark.slow
def test_race_of_the_model_settings(tmp_path):
    """`--preset model --model-settings`: every run trains the model target's settings (here
    tiny sizes, stage two from epoch 2 of 3, stress), mace_run_train with the same recipe."""
    store, split, _ = make_store(tmp_path / "store", n=24)
    parser = argparse.ArgumentParser()
    accuracy.add_arguments(parser)
    out = tmp_path / "bench"
    block = {"model": {"hidden_irreps": "8x0e+8x1o", "max_ell": 2, "correlation": 2,
                       "radial_mlp": [8, 8], "num_bessel": 4},
             "stage_two": {"start_epoch": 2}, "batch": {"graphs_per_batch": 3}}
    args = parser.parse_args([
        "--graphs", str(store), "--split", str(split), "--preset", "model", "--model-settings",
        json.dumps(block), "--epochs", "3", "--ranks", "1", "--threads", "2",
        "--extra-epochs", "0", "--name", "race", "--output-dir", str(out),
        "--figure", str(tmp_path / "fig.png"), "--set", "threads=1"])
    assert accuracy.run(args) == 0
    config = json.loads((out / "accuracy_race.json").read_text())["per_seed"][0]["config"]
    assert config["model"]["hidden_irreps"] == "8x0e+8x1o" and config["epochs"] == 3
    assert config["stage_two"]["enabled"] and config["optim"]["stress_weight"] == 1.0
    assert config["patience"] == 0  # every run trains the same epochs
    work = out / "accuracy_race" / "seed0"
    for variant in ("baseline", "both"):
        lrs = pd.read_csv(work / variant / "epochs.csv").lr.tolist()
        assert lrs[2] == 0.001 and lrs[1] != 0.001, (variant, lrs)
    log = (work / MACE / "mace_run_train.log").read_text()
    assert "Stage Two (after 2 epochs)" in log and "Changing loss based on Stage Two" in log
    curves = pd.read_csv(out / "accuracy_race.csv")
    assert sorted(set(curves.run)) == sorted(accuracy.RUNS) and set(curves.epoch) == {0, 1, 2}


def test_model_settings_block_is_checked():
    parser = argparse.ArgumentParser(exit_on_error=False)
    accuracy.add_arguments(parser)
    with pytest.raises(argparse.ArgumentError, match="unknown key 'epochz'"):
        parser.parse_args(["--dataset", "x", "--model-settings", '{"epochz": 3}'])
