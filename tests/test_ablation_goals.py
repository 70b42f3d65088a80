"""`cfmtrain goals`: the ablation goals checked on the cells of consecutive runs, each
check against numbers written here: spread (max - min) / median per cell, the variants' order at
2 ranks, `both`/`baseline` on mini_m, and one order over all runs."""

from __future__ import annotations

import argparse

import pandas as pd
import pytest
from helpers import GOOD, write_goal_run

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


def test_three_good_runs_pass_every_check(tmp_path):
    roots = [write_goal_run(tmp_path / f"run{k}") for k in (1, 2, 3)]
    code, checks = run_goals(tmp_path, *roots)
    assert code == 0 and failed(checks) == []
    # per run: 12 spreads, 2 orderings (the 2-rank groups), 1 speed-up; then 2 same-orderings
    assert len(checks) == 3 * (12 + 2 + 1) + 2
    speedup = checks[checks.check == "speedup"]
    assert speedup.value.astype(float).tolist() == pytest.approx([18.0 / 3.9] * 3)
    spreads = checks[checks.check == "spread"].value.astype(float)
    assert spreads.tolist() == pytest.approx([0.05] * 36)
    order = checks[(checks.check == "ordering") & (checks.subject == "mini_m r2")]
    assert set(order.value) == {"both < kernel < balancer < baseline"}


def test_each_goal_fails_alone(tmp_path):
    # a cell 10.5% wide fails its spread only
    wide = write_goal_run(tmp_path / "wide", override={("mini_s", 2, "kernel"): (2.8, 2.7, 2.994)})
    code, checks = run_goals(tmp_path, wide)
    assert code == 1 and failed(checks) == [("1", "spread", "mini_s r2 kernel")]
    assert float(checks[checks.subject == "mini_s r2 kernel"].value.iloc[0]) == \
        pytest.approx(0.294 / 2.8)
    # `kernel` faster than `both` on mini_m breaks the ordering there
    tie = {**GOOD, ("mini_m", 2): {**GOOD[("mini_m", 2)], "kernel": 3.8}}
    code, checks = run_goals(tmp_path, write_goal_run(tmp_path / "tie", tie))
    assert code == 1 and failed(checks) == [("1", "ordering", "mini_m r2")]
    # `balancer` slower than `baseline` at 2 ranks breaks it too (both still first)
    slow = {**GOOD, ("mini_s", 2): {**GOOD[("mini_s", 2)], "balancer": 9.5}}
    code, checks = run_goals(tmp_path, write_goal_run(tmp_path / "slow", slow))
    assert failed(checks) == [("1", "ordering", "mini_s r2")]
    # 2.9x on mini_m misses the speed-up goal; a lower limit accepts it
    low = {**GOOD, ("mini_m", 2): {**GOOD[("mini_m", 2)], "baseline": 11.31, "balancer": 10.0}}
    code, checks = run_goals(tmp_path, write_goal_run(tmp_path / "low", low))
    assert failed(checks) == [("1", "speedup", "mini_m r2 both/baseline")]
    code, checks = run_goals(tmp_path, tmp_path / "low", **{"min-speedup": 2.5})
    assert code == 0


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
    with pytest.raises(SystemExit, match=r"empty: no training cells"):
        run_goals(tmp_path, tmp_path / "empty")
    lone = write_goal_run(tmp_path / "lone", {("mini_m", 2): {"baseline": 9.0, "both": 3.0}})
    with pytest.raises(SystemExit, match=r"mini_m at 2 ranks: the table has"):
        run_goals(tmp_path, lone)
