"""Repeated cells and contention: the cell's summary from known repeat summaries (median, min,
max, contended), the contention verdict from known wall/CPU and steal numbers, the host samples
from /proc-format files, and `cfmtrain cell` end to end (2 tiny repeats through the launcher,
then a rerun, as Snakemake's --forcerun does, that measures both again)."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers import COMMON, REPO

from cfmtrain.measure import repeats
from cfmtrain.ranks import contention
from cfmtrain.ranks.launch import completed_run
from cfmtrain.train import cli as train_cli

LIMITS = contention.Thresholds(max_wall_cpu_ratio=1.15, max_steal_fraction=0.02)


def run_summary(epoch_time: float, ratio: float, steal: tuple[float, float] = (0.0, 0.0),
                probes: tuple[float, float] = (0.10, 0.10), cpu: float = 8.0, **extra) -> dict:
    """A repeat's summary.json as `cfmtrain train` writes it (the keys the cell reads)."""
    host = {"loadavg_start": 0.5, "loadavg_end": 1.5, "steal_start": steal[0],
            "steal_end": steal[1], "cpu_total_start": 1000.0, "cpu_total_end": 1100.0,
            "cpu_time_s": cpu, "wall_cpu_ratio": ratio, "probe_start_s": probes[0],
            "probe_end_s": probes[1]}
    return {"variant": "both", "ranks": 2, "epoch_time_s": epoch_time, "host": host, **extra}


def test_cell_summary_is_the_median_with_min_max_and_flags():
    summaries = [run_summary(10.0, 1.02, val=1), run_summary(14.0, 1.40, val=2),
                 run_summary(11.0, 1.05, steal=(5.0, 8.0), val=3, resumed_epochs=[1])]
    cell, middle = repeats.aggregate(summaries, LIMITS)
    assert middle == 2 and cell["outputs_of_repeat"] == 3 and cell["val"] == 3
    assert (cell["epoch_time_s"], cell["epoch_time_min_s"], cell["epoch_time_max_s"]) == (
        11.0, 10.0, 14.0)
    flags = [(r["repeat"], r["contended"]) for r in cell["repeats"]]
    assert flags == [(1, False), (2, True), (3, True)]  # wall/CPU 1.40; steal 3 of 100 s
    assert "wall/CPU 1.400 > 1.15" in cell["repeats"][1]["contended_because"]
    assert "steal 0.030" in cell["repeats"][2]["contended_because"]
    assert cell["repeats"][2]["steal_fraction"] == pytest.approx(0.03)
    assert [r["resumed_epochs"] for r in cell["repeats"]] == [[], [], [1]]
    assert cell["contended"] is True and "host" not in cell
    first = cell["repeats"][0]
    assert {k: first[k] for k in ("epoch_time_s", "cpu_time_s", "wall_cpu_ratio",
                                  "loadavg_start", "loadavg_end", "steal_start", "steal_end",
                                  "contended_because")} == {
        "epoch_time_s": 10.0, "cpu_time_s": 8.0, "wall_cpu_ratio": 1.02, "loadavg_start": 0.5,
        "loadavg_end": 1.5, "steal_start": 0.0, "steal_end": 0.0, "contended_because": ""}
    assert cell["contention_thresholds"] == {"max_wall_cpu_ratio": 1.15,
                                             "max_steal_fraction": 0.02,
                                             "max_probe_slowdown": 0.15,
                                             "max_cpu_slowdown": 0.10}


def test_a_repeat_whose_speed_probe_ran_slow_is_flagged_against_the_cells_fastest():
    """The slower of a repeat's two probes against the fastest probe of the cell: 0.115 s is
    15% over 0.100 (not flagged: at the limit), 0.120 is 20% (flagged), whatever its wall/CPU;
    a cell uniformly slower (every probe 0.2 s) flags nothing."""
    summaries = [run_summary(10.0, 1.0, probes=(0.100, 0.105)),
                 run_summary(10.5, 1.0, probes=(0.115, 0.101)),
                 run_summary(12.0, 1.0, probes=(0.103, 0.120))]
    cell, _ = repeats.aggregate(summaries, LIMITS)
    records = cell["repeats"]
    assert [r["probe_s"] for r in records] == [0.105, 0.115, 0.120]
    assert [r["probe_slowdown"] for r in records] == pytest.approx([0.05, 0.15, 0.20])
    assert [r["contended"] for r in records] == [False, False, True]
    assert records[2]["contended_because"] == (
        "host slower: speed probe 20% over the cell's fastest > 15%")
    slow = [run_summary(10.0, 1.0, probes=(0.2, 0.2)) for _ in range(3)]
    assert repeats.aggregate(slow, LIMITS)[0]["contended"] is False
    old = run_summary(10.0, 1.0)
    del old["host"]["probe_start_s"], old["host"]["probe_end_s"]  # written before the probe
    cell, _ = repeats.aggregate([old, run_summary(10.0, 1.0)], LIMITS)
    assert math.isnan(cell["repeats"][0]["probe_slowdown"]) and cell["contended"] is False
    with pytest.raises(ValueError, match="max_probe_slowdown must be at least 0"):
        contention.Thresholds(max_probe_slowdown=-0.1)


def test_a_repeat_that_took_more_cpu_time_on_the_same_work_is_flagged():
    """The repeats do identical work: a repeat's compute CPU time against the cell's least.
    8.7 s is 9% over 8.0 (not flagged), 9.3 s is 16% (flagged, as the slow
    repeat of `both` on mini_s at 2 ranks was on 2026-11-29, its probe only 5% slow); an unknown
    CPU time flags nothing and is no reference."""
    summaries = [run_summary(3.0, 1.0, cpu=8.0), run_summary(3.2, 1.0, cpu=8.7),
                 run_summary(3.5, 1.0, probes=(0.100, 0.105), cpu=9.3)]
    cell, _ = repeats.aggregate(summaries, LIMITS)
    records = cell["repeats"]
    assert [r["cpu_slowdown"] for r in records] == pytest.approx([0.0, 0.0875, 0.1625])
    assert [r["contended"] for r in records] == [False, False, True]
    assert records[2]["contended_because"] == (
        "host slower: compute CPU time 16% over the cell's least on identical work > 10%")
    unknown = run_summary(3.0, 1.0, cpu=None)  # NaN, written as null
    cell, _ = repeats.aggregate([unknown, run_summary(3.0, 1.0, cpu=9.0)], LIMITS)
    assert math.isnan(cell["repeats"][0]["cpu_slowdown"]) and cell["contended"] is False
    assert cell["repeats"][1]["cpu_slowdown"] == 0.0
    with pytest.raises(ValueError, match="max_cpu_slowdown must be at least 0"):
        contention.Thresholds(max_cpu_slowdown=-0.1)


def test_a_contended_repeat_is_flagged_not_re_measured(tmp_path, monkeypatch):
    """`cfmtrain cell --repeats 3`, one repeat 25% slow on identical work: one launch trains
    the three, the cell reports all three (median, min, max) and flags the slow one; the
    median repeat's outputs are published."""
    launches, cpus = [], [8.0, 10.0, 8.2]

    def fake_launch(argv):
        launches.append(argv)
        for k in (1, 2, 3):
            rep = tmp_path / f"rep{k}"
            rep.mkdir(parents=True)
            for name in repeats.PUBLISHED:
                (rep / name).write_text(f"{name} of rep{k}")
            (rep / "summary.json").write_text(json.dumps(run_summary(cpus[k - 1] / 2, 1.0,
                                                                     cpu=cpus[k - 1])))
        return 0, False

    monkeypatch.setattr(repeats, "run_child", fake_launch)
    parser = argparse.ArgumentParser()
    repeats.add_arguments(parser)
    args = parser.parse_args(["--repeats", "3", "--ranks", "1", "--", "train", "--output",
                              str(tmp_path)])
    handler = signal.getsignal(signal.SIGTERM)
    try:
        assert repeats.run(args) == 0
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert len(launches) == 1 and launches[0][-2:] == ["--repeats", "3"]
    cell = json.loads((tmp_path / "summary.json").read_text())
    assert (cell["epoch_time_s"], cell["epoch_time_min_s"], cell["epoch_time_max_s"]) == (
        4.1, 4.0, 5.0)
    assert [r["contended"] for r in cell["repeats"]] == [False, True, False]
    assert cell["contended"] is True and cell["outputs_of_repeat"] == 3
    assert (tmp_path / "steps.csv").read_text() == "steps.csv of rep3"


def test_even_count_median_and_an_undisturbed_cell():
    cell, middle = repeats.aggregate([run_summary(12.0, 1.0), run_summary(10.0, 1.1)], LIMITS)
    assert cell["epoch_time_s"] == 11.0 and middle == 1  # lower middle repeat's outputs
    assert cell["contended"] is False


def test_unknown_measures_do_not_flag_but_a_missing_epoch_time_is_an_error():
    summary = run_summary(10.0, 1.0)
    summary["host"].update(wall_cpu_ratio=None, steal_start=None)  # NaN, written as null
    cell, _ = repeats.aggregate([summary], LIMITS)
    assert cell["contended"] is False and math.isnan(cell["repeats"][0]["steal_fraction"])
    with pytest.raises(ValueError, match=r"repeats \[2\] have no epoch time"):
        repeats.aggregate([run_summary(10.0, 1.0), run_summary(None, 1.0)], LIMITS)


def test_wall_over_cpu_of_the_timed_epochs():
    rows = [{"epoch": 0, "compute_s": 9.0, "compute_cpu_s": 1.0},  # warm-up: left out
            {"epoch": 1, "compute_s": 2.4, "compute_cpu_s": 2.0},
            {"epoch": 1, "compute_s": 3.6, "compute_cpu_s": 3.0}]
    cpu, ratio = contention.compute_wall_cpu(rows, first_epoch=1)
    assert (cpu, ratio) == (pytest.approx(5.0), pytest.approx(1.2))
    assert contention.verdict(ratio, 0.0, LIMITS) == "compute wall/CPU 1.200 > 1.15"
    assert contention.verdict(1.15, 0.02, LIMITS) == ""  # at the limits: not contended
    assert math.isnan(contention.compute_wall_cpu(rows, first_epoch=2)[1])
    with pytest.raises(ValueError, match="max_wall_cpu_ratio must be at least 1"):
        contention.Thresholds(max_wall_cpu_ratio=0.9)


def test_host_sample_reads_proc_files(tmp_path):
    (tmp_path / "loadavg").write_text("1.75 0.80 0.30 2/150 4242\n")
    hz = os.sysconf("SC_CLK_TCK")
    (tmp_path / "stat").write_text(f"cpu  {6 * hz} 0 {2 * hz} {10 * hz} 0 0 0 {2 * hz} 0 0\n"
                                   "cpu0 1 2 3 4 5 6 7 8 9 10\n")
    sample = contention.host_sample(tmp_path / "loadavg", tmp_path / "stat")
    assert sample == {"loadavg": 1.75, "steal": 2.0, "cpu_total": 20.0}
    missing = contention.host_sample(tmp_path / "none", tmp_path / "none")
    assert all(math.isnan(v) for v in missing.values())


def test_the_command_must_be_train_with_an_output(tmp_path):
    with pytest.raises(ValueError, match="--output"):
        repeats.cell_command(["train", "--graphs", "g"], 2)
    with pytest.raises(ValueError, match="cfmtrain cell --repeats"):
        repeats.cell_command(["train", "--output", str(tmp_path), "--repeats", "2"], 2)
    assert repeats.cell_command(["train", "--output", str(tmp_path), "--x"], 2) == tmp_path
    assert train_cli.repeat_outputs(tmp_path, None) == [tmp_path]
    assert train_cli.repeat_outputs(tmp_path, 2) == [tmp_path / "rep1", tmp_path / "rep2"]
    with pytest.raises(ValueError, match="at least 1"):
        train_cli.repeat_outputs(tmp_path, 0)
    # the launcher's "complete" after a stop: the last repeat's summary.json (rep2 of 2)
    since = time.time() - 1
    command = ["train", "--output", str(tmp_path), "--repeats", "2"]
    assert completed_run(command, since) is None
    (tmp_path / "rep2").mkdir()
    (tmp_path / "rep2" / "summary.json").write_text("{}")
    assert completed_run(command, since) == tmp_path / "rep2" / "summary.json"


def cell_argv(data, out: Path, *settings: str, limits: tuple[str, ...] = ()) -> list[str]:
    """`cfmtrain cell` of 2 tiny repeats on one rank, as the rule train_cell runs it (more
    contention `limits` options if given)."""
    argv = [sys.executable, "-m", "cfmtrain", "cell", "--repeats", "2", "--ranks", "1",
            "--threads", "1", "--max-wall-cpu-ratio", "1.15", *limits,
            "--", "train", "--graphs",
            str(data[0]), "--split", str(data[1]), "--output", str(out), "--variant", "both",
            "--resume", "auto"]
    for setting in (*COMMON, *settings):
        argv += ["--set", setting]
    return argv


ENV = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


def cell(data, out: Path, *settings: str, **options) -> subprocess.CompletedProcess:
    """Run `cell_argv` to its end."""
    return subprocess.run(cell_argv(data, out, *settings, **options), cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_cell_of_two_repeats_end_to_end_and_rerun(data, tmp_path):
    out = tmp_path / "cell"
    result = cell(data, out)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("cfmtrain launch (direct)") == 1  # both repeats in one process
    assert result.stderr.count("memory warm-up") == 1  # the second repeat reuses the memory
    reps = [json.loads((out / f"rep{k}" / "summary.json").read_text()) for k in (1, 2)]
    # each repeat trains afresh with the same seed: the same losses, nothing carried over (nor
    # the first repeat's warm-up)
    losses = [pd.read_csv(out / f"rep{k}" / "epochs.csv").train_loss.tolist() for k in (1, 2)]
    assert losses[0] == losses[1] and len(losses[0]) == 2
    assert reps[0]["stats"] == reps[1]["stats"] and reps[0]["e0s"] == reps[1]["e0s"]
    summary = json.loads((out / "summary.json").read_text())
    times = sorted(r["epoch_time_s"] for r in reps)
    assert summary["epoch_time_s"] == pytest.approx(sum(times) / 2)
    assert (summary["epoch_time_min_s"], summary["epoch_time_max_s"]) == tuple(times)
    assert [r["repeat"] for r in summary["repeats"]] == [1, 2]
    assert summary["contended"] == any(r["contended"] for r in summary["repeats"])
    for rep, record in zip(reps, summary["repeats"], strict=True):
        # each repeat's epoch time leaves out its first epoch (warm-up)
        assert rep["epoch_time_s"] == pytest.approx(rep["epoch_times_s"][1])
        # any limit flags a repeat (wall/CPU given here; steal, probe, CPU time: the defaults)
        assert record["contended"] == (record["wall_cpu_ratio"] > 1.15
                                       or record["steal_fraction"] > 0.02
                                       or record["probe_slowdown"] > 0.15
                                       or record["cpu_slowdown"] > 0.10)
        assert record["probe_s"] > 0 and record["probe_slowdown"] >= 0
        assert record["wall_cpu_ratio"] >= 0.999 and record["cpu_time_s"] > 0
    k = summary["outputs_of_repeat"]
    assert summary["epoch_times_s"] == reps[k - 1]["epoch_times_s"]
    for name in repeats.PUBLISHED:  # the median repeat's outputs, where readers look for them
        assert (out / name).read_bytes() == (out / f"rep{k}" / name).read_bytes(), name
    steps = pd.read_csv(out / "steps.csv")
    assert {"cpu_s", "compute_cpu_s"} <= set(steps.columns)
    assert not (out / "checkpoint.pt").exists()

    # a rerun (snakemake --forcerun removes summary.json first) trains both repeats again, in
    # one launch; any CPU time over the least flags here (limit 0): flagged, not re-measured
    (out / "summary.json").unlink()
    before = [(out / f"rep{k}" / "steps.csv").stat().st_mtime_ns for k in (1, 2)]
    result = cell(data, out, limits=("--max-cpu-slowdown", "0"))
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("not resumed, its run is finished: starting afresh") == 2
    assert result.stderr.count("cfmtrain launch (direct)") == 1
    after = [(out / f"rep{k}" / "steps.csv").stat().st_mtime_ns for k in (1, 2)]
    assert all(a > b for a, b in zip(after, before, strict=True))
    summary = json.loads((out / "summary.json").read_text())
    assert [r["repeat"] for r in summary["repeats"]] == [1, 2] and not (out / "rep3").exists()
    slower = [r for r in summary["repeats"] if r["cpu_slowdown"] > 0]
    assert len(slower) == 1 and slower[0]["contended"] and summary["contended"]


@pytest.mark.slow
def test_a_repeat_stopped_part_way_fails_the_cell_and_continues_in_the_next(data, tmp_path):
    out = tmp_path / "cell"
    result = cell(data, out, "max_steps=3")  # repeat 1 stops with a checkpoint, exit 0
    assert result.returncode == 1, result.stderr
    assert f"repeat 1 ({out / 'rep1'}) did not finish (exit 0)" in result.stderr
    assert not (out / "summary.json").exists() and not (out / "rep2").exists()
    result = cell(data, out, "max_steps=0")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("resuming at epoch 0, step 3 of the epoch") == 1
    summary = json.loads((out / "summary.json").read_text())
    assert [r["repeat"] for r in summary["repeats"]] == [1, 2]
    assert [r["resumed_epochs"] for r in summary["repeats"]] == [[0], []]


@pytest.mark.slow
def test_sigterm_reaches_the_repeat_which_checkpoints(data, tmp_path):
    out = tmp_path / "cell"
    proc = subprocess.Popen(cell_argv(data, out, "epochs=200"), cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "rep1" / "epochs.csv").exists():  # repeat 1 is training
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "repeat 1" in err and "did not finish (exit 0, SIGTERM)" in err
    assert (out / "rep1" / "checkpoint.pt").exists() and not (out / "summary.json").exists()



@pytest.mark.parametrize("count, code", [(3, 143), (2, 0)])
def test_a_stop_after_a_complete_repeat_ends_the_cell_unless_it_was_the_last(
        tmp_path, monkeypatch, count, code):
    def fake_launch(argv):  # repeats 1 and 2 complete, SIGTERM seen, the training stops
        out = Path(argv[argv.index("--output") + 1])
        for k in (1, 2):
            (out / f"rep{k}").mkdir(parents=True)
            for name in repeats.PUBLISHED:
                (out / f"rep{k}" / name).write_text(name)
            (out / f"rep{k}" / "summary.json").write_text(json.dumps(run_summary(10.0 + k, 1.0)))
        assert argv[-2:] == ["--repeats", str(count)]
        return 0, True

    monkeypatch.setattr(repeats, "run_child", fake_launch)
    parser = argparse.ArgumentParser()
    repeats.add_arguments(parser)
    args = parser.parse_args(["--repeats", str(count), "--ranks", "1", "--", "train",
                              "--output", str(tmp_path)])
    handler = signal.getsignal(signal.SIGTERM)
    try:
        assert repeats.run(args) == code
    finally:
        signal.signal(signal.SIGTERM, handler)  # a complete cell ignores SIGTERM from then on
    assert (tmp_path / "summary.json").exists() == (code == 0)


@pytest.mark.parametrize("stop_in, trained", [(1, ["rep1"]), (3, ["rep1", "rep2", "rep3"])])
def test_the_training_stops_between_repeats_on_sigterm(tmp_path, monkeypatch, stop_in,
                                                       trained):
    """`train --repeats 3`: a SIGTERM during a repeat that still completes ends the training
    before the next repeat (ranks agree on it); during the last one, all three are done."""
    from cfmtrain.ranks import distenv

    calls = []

    def fake_one(args, output, state, cfg, env, device, stop, last, stats=None):
        calls.append(output.name)
        stop.requested = len(calls) == stop_in
        assert last == (len(calls) == 3)
        # the first repeat computes the training set's statistics, the later ones reuse them
        assert stats == (None if len(calls) == 1 else {"from": "rep1"})
        return True, stats or {"from": output.name}

    monkeypatch.setattr(train_cli, "_train_one", fake_one)
    monkeypatch.setattr(train_cli, "_settings", lambda *a: (None, argparse.Namespace(
        timeout_s=60)))
    monkeypatch.setattr(distenv, "init_process_group", lambda env, timeout_s: "cpu")
    monkeypatch.setattr(distenv, "destroy", lambda: None)
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["--graphs", "g", "--split", "s", "--output", str(tmp_path),
                              "--repeats", "3"])
    handler = signal.getsignal(signal.SIGTERM)
    try:
        assert train_cli.run(args) == 0
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert calls == trained
