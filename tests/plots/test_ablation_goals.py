"""`cfmtrain goals`: the ablation goals checked on the paired ratios of consecutive runs' groups
(paired.csv as `cfmtrain rounds` writes it, from rounds with known times and a host drift that
cancels), each check against numbers written here: `both` first by its 10% quantile, `kernel`
and `balancer` not slower, `both`/`baseline` on mini_m, every ratio's spread, one order over
all runs."""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import pytest
from helpers import GOOD, NOISE, goal_rounds, write_goal_run

from cfmtrain.plots import goals


def run_goals(tmp_path, *roots, **options) -> tuple[int, pd.DataFrame]:
    parser = argparse.ArgumentParser()
    goals.add_arguments(parser)
    out = tmp_path / "goals.csv"
    args = parser.parse_args([*map(str, roots), "--output", str(out),
                              *[w for k, v in options.items() for w in (f"--{k}", str(v))]])
    return goals.run(args), pd.read_csv(out)


def failed(checks: pd.DataFrame) -> list[tuple]:
    rows = checks[~checks.passed.astype(bool)]
    return list(zip(rows.run.astype(str), rows.check, rows.subject, strict=True))


def spread_of(width: float) -> float:
    """(p90 - p10) / median of 1 / (1 + NOISE * width), as numpy's quantiles give it."""
    values = 1 / (1 + np.array(NOISE) * width)
    p10, median, p90 = np.quantile(values, [0.1, 0.5, 0.9])
    return (p90 - p10) / median


def test_three_good_runs_pass_every_check(tmp_path, capsys):
    roots = [write_goal_run(tmp_path / f"run{k}") for k in (1, 2, 3)]
    code, checks = run_goals(tmp_path, *roots)
    assert code == 0 and failed(checks) == []
    # per run: 5 spreads per group (3 over the baseline, both over 2 others) x 3 groups,
    # 3 `both first` and 2 `not slower` per 2-rank group, the speed-up and its p10; then the
    # same ordering of the 2 two-rank groups
    assert len(checks) == 3 * (15 + 2 * 5 + 2) + 2
    speedup = checks[checks.check == "speedup"]
    assert speedup.value.astype(float).tolist() == pytest.approx([18.0 / 3.9] * 3)
    p10 = checks[checks.check == "speedup p10"].value.astype(float)
    assert p10.tolist() == pytest.approx([18.0 / 3.9 * (1 - spread_of(0.02) / 2)] * 3, rel=2e-3)
    spreads = checks[checks.check == "spread"]
    over = spreads.subject.str.endswith("/baseline")
    assert spreads[over].value.astype(float).tolist() == pytest.approx([spread_of(0.02)] * 27)
    assert spreads[~over].value.astype(float).between(0.01, 0.1).all()
    first = checks[(checks.check == "both first") & (checks.subject == "mini_m r2 both/kernel p10")]
    rounds = goal_rounds(GOOD[("mini_m", 2)])
    p10 = np.quantile(rounds.times("kernel") / rounds.times("both"), 0.1)
    assert first.value.astype(float).tolist() == pytest.approx([p10] * 3)
    order = checks[(checks.check == "same ordering") & (checks.subject == "mini_m r2")]
    assert set(order.value) == {"both > kernel > balancer > baseline"}
    shown = capsys.readouterr().out
    # the median round's host drift is 1.1
    assert "mini_m r2 baseline    19.800 s (14.400-27.000 s, not judged)" in shown


def test_each_goal_fails_alone(tmp_path):
    # kernel's rounds on mini_s at 2 ranks wobble +-8%: its ratios spread beyond 10%
    wide = write_goal_run(tmp_path / "wide", widths={("mini_s", 2): {"kernel": 0.08}})
    code, checks = run_goals(tmp_path, wide)
    assert code == 1 and failed(checks) == [("1", "spread", "mini_s r2 kernel/baseline"),
                                            ("1", "spread", "mini_s r2 both/kernel")]
    assert spread_of(0.08) > 0.10 > spread_of(0.02)
    # `kernel` as fast as `both` on mini_m: both's p10 over kernel is below 1
    tie = {**GOOD, ("mini_m", 2): {**GOOD[("mini_m", 2)], "kernel": 3.9}}
    code, checks = run_goals(tmp_path, write_goal_run(tmp_path / "tie", tie))
    assert code == 1 and failed(checks) == [("1", "both first", "mini_m r2 both/kernel p10")]
    # `balancer` slower than `baseline` at 2 ranks
    slow = {**GOOD, ("mini_s", 2): {**GOOD[("mini_s", 2)], "balancer": 9.5}}
    code, checks = run_goals(tmp_path, write_goal_run(tmp_path / "slow", slow))
    assert failed(checks) == [("1", "not slower", "mini_s r2 balancer/baseline")]
    # 2.9x on mini_m (p10 2.85x) misses the median goal; a lower limit accepts it
    low = {**GOOD, ("mini_m", 2): {**GOOD[("mini_m", 2)], "baseline": 11.31, "balancer": 10.0}}
    code, checks = run_goals(tmp_path, write_goal_run(tmp_path / "low", low))
    assert failed(checks) == [("1", "speedup", "mini_m r2 both/baseline")]
    code, checks = run_goals(tmp_path, tmp_path / "low", **{"min-speedup": 2.5})
    assert code == 0
    # a median of 3.0x whose p10 is below 2.7x fails the p10 goal alone
    edge = {**GOOD, ("mini_m", 2): {**GOOD[("mini_m", 2)], "baseline": 11.7, "balancer": 11.0}}
    code, checks = run_goals(tmp_path, write_goal_run(tmp_path / "edge", edge,
                                                      widths={("mini_m", 2): {"both": 0.25}}),
                             **{"max-spread": 1.0})
    assert failed(checks) == [("1", "speedup p10", "mini_m r2 both/baseline")]


def test_a_changed_order_between_runs_fails_only_the_same_ordering(tmp_path):
    # balancer ahead of kernel in run 2: every run's own checks pass, their orders differ
    swapped = {**GOOD, ("mini_m", 2): {**GOOD[("mini_m", 2)], "balancer": 5.0}}
    roots = [write_goal_run(tmp_path / "a"), write_goal_run(tmp_path / "b", swapped)]
    code, checks = run_goals(tmp_path, *roots)
    assert code == 1 and failed(checks) == [("all", "same ordering", "mini_m r2")]


def test_other_variants_are_left_out_and_bad_folders_are_named(tmp_path):
    root = write_goal_run(tmp_path / "run", {**GOOD, ("mini_s", 2): {**GOOD[("mini_s", 2)],
                                                                     "matched": 99.0}})
    code, checks = run_goals(tmp_path, root)
    assert code == 0 and not checks.subject.str.contains("matched").any()
    with pytest.raises(SystemExit, match=r"empty: no ablation groups"):
        run_goals(tmp_path, tmp_path / "empty")
    lone = write_goal_run(tmp_path / "lone", {("mini_m", 2): {"baseline": 9.0, "both": 3.0}})
    with pytest.raises(SystemExit, match=r"mini_m at 2 ranks: no paired ratio of both over "
                                         r"balancer"):
        run_goals(tmp_path, lone)
