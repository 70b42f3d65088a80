"""`cfmtrain bench scale` on a small count: every stage measured, the table, CSV and figure
written, and the training run's own timings in range; the Snakemake target `scale` collecting
the same rows from the pipeline's jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import REPO

from cfmtrain.bench.scale import COLUMNS, STAGES


@pytest.mark.slow
def test_scale_bench_on_a_small_count(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "cfmtrain", "bench", "scale", "--graphs", "300", "--steps", "4",
         "--shard-graphs", "150", "--scaling-rounds", "1", "--work", str(tmp_path / "work"),
         "--output", str(tmp_path / "scale.csv"), "--figure", str(tmp_path / "scale.png")],
        capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "data path at scale" in out.stdout
    table = pd.read_csv(tmp_path / "scale.csv")
    assert tuple(table.columns) == COLUMNS
    stages = list(STAGES)
    stages.insert(stages.index("graphs") + 1, "graphs_2_processes")
    assert list(table["stage"]) == stages
    assert (table["graphs"] == 300).all()
    by = table.set_index("stage")
    assert (by["seconds"] > 0).all()
    # the launch's start-up holds the store's opening and statistics
    assert by.loc["first_step", "seconds"] > by.loc["open", "seconds"] + \
        by.loc["statistics", "seconds"]
    assert 0 <= by.loc["steps", "data_wait_share"] < 1
    assert 0 < by.loc["epoch_overhead", "epoch_share"] < 1
    for stage in ("generate", "graphs", "split", "steps"):
        assert 0.05 < by.loc[stage, "peak_rss_gb"] < 8
    # two ranks' summed PSS: more than one rank's share, less than two whole ranks
    assert by.loc["steps", "pss_gb_all_ranks"] > 0.5 * by.loc["steps", "peak_rss_gb"]
    assert by.loc["graphs", "disk_gb"] > 0 and by.loc["generate", "disk_gb"] > 0
    scaling = by.loc["graphs_2_processes"]
    assert scaling["rounds"] == 1 and 0.8 < scaling["ratio_median"] < 3  # ideal 2 (2 cores)
    assert (tmp_path / "scale.png").stat().st_size > 10_000
    assert not (tmp_path / "work" / "300").exists()  # not kept without --keep


@pytest.mark.slow
def test_the_scale_target_runs_the_pipelines_rules_and_collects_their_jobs(tmp_path):
    """`snakemake scale`: each count a data set of the pipeline's rules (one graph job per
    shard), trained briefly; the table's rows are the jobs' own benchmark records."""
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config["scale"] = {"graphs": [200, 300], "steps": 3, "shard_graphs": 100}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    out = subprocess.run([sys.executable, "-m", "snakemake", "scale", "--cores", "2",
                          "--directory", str(tmp_path), "--configfile", str(tmp_path / "c.yaml")],
                         cwd=REPO, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                              f"{os.environ['PATH']}"})  # the jobs' `python`: this one
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = pd.read_csv(tmp_path / "results/bench/scale.csv").set_index(["graphs", "stage"])
    for count, shards in ((200, 2), (300, 3)):
        jobs = sorted((tmp_path / f"benchmarks/graphs/scale_{count}").glob("shard_*.tsv"))
        assert len(jobs) == shards
        records = pd.concat([pd.read_csv(j, sep="\t") for j in jobs])
        assert table.loc[(count, "graphs"), "seconds"] == pytest.approx(records.s.sum())
        assert table.loc[(count, "graphs"), "peak_rss_gb"] == pytest.approx(
            records.max_rss.max() * 2**20 / 1e9)
        run = tmp_path / f"results/scale/scale_{count}"
        timeline = json.loads((run / "timeline.json").read_text())
        assert timeline["launched_at"] < timeline["build_at"] < timeline["first_step_at"]
        assert table.loc[(count, "first_step"), "seconds"] == pytest.approx(
            timeline["first_step_at"] - timeline["launched_at"])
        steps = pd.read_csv(run / "steps.csv")
        assert steps.step.max() == 2 and set(steps["rank"]) == {0, 1}
        # two ranks: their summed PSS is over one rank's share, under two whole ranks
        pss, rss = (table.loc[(count, "steps"), k] for k in ("pss_gb_all_ranks", "peak_rss_gb"))
        assert 0.5 * rss < pss < 2 * rss
        assert {s for g, s in table.index if g == count} == set(STAGES)
    # opening the stores in paired rounds: 300 graphs against 200, 1.5x the graphs
    opened = table.loc[(300, "open")]
    assert opened["rounds"] == 7 and opened["ratio_p10"] <= opened["ratio_median"]
    assert 0.3 < opened["ratio_median"] < 6 and opened["ratio_median"] <= opened["ratio_p90"]
    assert (tmp_path / "results/figures/fig_scale.png").stat().st_size > 10_000
