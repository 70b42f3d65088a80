"""`cfmtrain bench host`: the spread of known probe times, and the command end to end (CSV rows,
GFLOP/s from the run's own times, the exit status against the spread limit)."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from cfmtrain.bench.host import spread


def test_spread_is_max_minus_min_over_the_median():
    s = spread([1.0, 1.2, 1.1, 0.9])
    assert (s["median_s"], s["min_s"], s["max_s"]) == (pytest.approx(1.05), 0.9, 1.2)
    assert s["spread"] == pytest.approx(0.3 / 1.05)
    assert spread([2.0, 2.0])["spread"] == 0


def bench_host(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cfmtrain", "bench", "host", "--probes", "3",
                           "--pause", "0", "--calls", "20", "--size", "64", "--gathers", "5",
                           "--rows", "4096", "--output",
                           str(tmp_path / "host.csv"), *extra],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_command_writes_its_probes_and_judges_the_spread(tmp_path):
    result = bench_host(tmp_path, "--max-spread", "1000")
    assert result.returncode == 0, result.stderr
    rows = pd.read_csv(tmp_path / "host.csv")
    assert rows.probe.tolist() == [0, 1, 2] and (rows.wall_s > 0).all()
    assert rows.gflop_s.tolist() == pytest.approx((2 * 64**3 * 20 / rows.matmul_s / 1e9).tolist())
    assert rows.wall_s.tolist() == pytest.approx((rows.matmul_s + rows.gather_s).tolist())
    assert (rows.gather_s > 0).all() and (rows.cpu_s > 0).all()
    assert (rows.start_s.diff().dropna() > 0).all() and (rows.steal_s >= 0).all()
    assert "host steady" in result.stdout
    # three timings of real work are never exactly equal: a zero limit calls any host unsteady
    result = bench_host(tmp_path, "--max-spread", "0")
    assert result.returncode == 1 and "host UNSTEADY" in result.stdout


@pytest.mark.slow
def test_bad_arguments_are_refused(tmp_path):
    result = bench_host(tmp_path, "--probes", "1")
    assert result.returncode != 0 and "--probes must be >= 2" in result.stderr
    result = bench_host(tmp_path, "--gathers", "0")
    assert result.returncode != 0 and "--gathers and --rows >= 1" in result.stderr
    assert not (tmp_path / "host.csv").exists()
