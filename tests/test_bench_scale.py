"""`cfmtrain bench scale` on a small count: every stage measured, the table, CSV and figure
written, and the training run's own timings in range."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from cfmtrain.bench.scale import COLUMNS
from cfmtrain.bench.scale_figure import STAGES


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
