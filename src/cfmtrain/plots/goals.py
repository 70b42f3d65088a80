"""`cfmtrain goals RESULTS ...`: the ablation's goals, checked on the paired ratios of its groups
(RESULTS/train/<data set>/r<ranks>/paired.csv of `cfmtrain rounds`: per-round ratios of each
variant against the baseline and of `both` against every other variant) of one or more
consecutive `make run`s, each run's `results` folder (or a copy of it):
- at --ranks (2), on every data set, `both`'s 10% quantile against each other variant is
  above 1, and `kernel` and `balancer` each have a median of at least 1 against `baseline`;
- `both`/`baseline` on --speedup-dataset at --ranks has a median of at least --min-speedup and
  a 10% quantile of at least --min-speedup-p10;
- every group's per-round ratios spread (p90 - p10) at most --max-spread of their median;
- the order of the variants (by their median over the baseline) at --ranks is the same in
  every run given.
It prints one line per run and check, then each variant's epoch time and its min-max over the
rounds (reported, not judged), writes the checks to --output (CSV) if given, and exits 1 if any
check fails. Whether `make run` stayed within its time limit is not in the table: time the runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from cfmtrain.atomic import atomic_path
from cfmtrain.measure.group_tables import PairedRecord, RoundRecord, read_paired, read_rounds
from cfmtrain.paper import ABLATION, BALANCER, BASELINE, BOTH, KERNEL

REFERENCE, BEST = BASELINE.name, BOTH.name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `cfmtrain goals`."""
    parser.add_argument("results", nargs="+", type=Path,
                        help="each run's results folder, in the order they ran")
    parser.add_argument("--max-spread", type=float, default=0.10,
                        help="largest (p90 - p10) / median of a group's per-round ratios "
                             "(default 0.10)")
    parser.add_argument("--ranks", type=int, default=2,
                        help="rank count whose variants are ordered (default 2)")
    parser.add_argument("--speedup-dataset", default="mini_m",
                        help="data set of the both/baseline goal (default mini_m)")
    parser.add_argument("--min-speedup", type=float, default=3.0,
                        help="least median both/baseline speed-up there (default 3.0)")
    parser.add_argument("--min-speedup-p10", type=float, default=2.7,
                        help="least 10%% quantile of that speed-up (default 2.7)")
    parser.add_argument("--output", type=Path, help="write the checks to this CSV")


def read_groups(results: Path) -> pd.DataFrame:
    """The paired ratios of one run's groups; a folder without groups is an error naming it."""
    paths = sorted(results.glob(f"train/*/r*/{PairedRecord.TABLE}"))
    if not paths:
        raise ValueError(f"{results}: no ablation groups (train/<data set>/r<ranks>/paired.csv "
                         "of `cfmtrain rounds`)")
    table = read_paired(paths)
    return table[table.variant.isin(ABLATION) & table.reference.isin(ABLATION)]


def _row(table: pd.DataFrame, dataset: str, ranks: int, variant: str, reference: str):
    rows = table[(table.dataset == dataset) & (table.ranks == ranks)
                 & (table.variant == variant) & (table.reference == reference)]
    if rows.empty:
        raise ValueError(f"{dataset} at {ranks} ranks: no paired ratio of {variant} over "
                         f"{reference}")
    return rows.iloc[0]


def order_at(table: pd.DataFrame, dataset: str, ranks: int) -> list[str]:
    """The variants of one data set at `ranks`, fastest (largest median over the baseline)
    first."""
    rows = table[(table.dataset == dataset) & (table.ranks == ranks)
                 & (table.reference == REFERENCE)]
    return list(rows.sort_values(PairedRecord.col.ratio_median, ascending=False,
                                 kind="stable").variant)


def _check(check: str, subject: str, value, limit, passed: bool) -> dict:
    return {"check": check, "subject": subject, "value": value, "limit": limit,
            "passed": bool(passed)}


def check_run(table: pd.DataFrame, max_spread: float, ranks: int, speedup_dataset: str,
              min_speedup: float, min_speedup_p10: float) -> list[dict]:
    """One run's checks: rows of (check, subject, value, limit, passed)."""
    checks = []
    for row in table[table.variant != table.reference].itertuples():
        spread = (row.ratio_p90 - row.ratio_p10) / row.ratio_median
        checks.append(_check("spread", f"{row.dataset} r{row.ranks} {row.variant}/"
                             f"{row.reference}", spread, max_spread, spread <= max_spread))
    for dataset in dict.fromkeys(table[table.ranks == ranks].dataset):
        for other in ABLATION:
            if other != BEST:
                p10 = float(_row(table, dataset, ranks, BEST, other).ratio_p10)
                checks.append(_check("both first", f"{dataset} r{ranks} both/{other} p10",
                                     p10, "> 1", p10 > 1))
        for variant in (KERNEL.name, BALANCER.name):
            median = float(_row(table, dataset, ranks, variant, REFERENCE).ratio_median)
            checks.append(_check("not slower", f"{dataset} r{ranks} {variant}/baseline",
                                 median, ">= 1", median >= 1))
    both = _row(table, speedup_dataset, ranks, BEST, REFERENCE)
    subject = f"{speedup_dataset} r{ranks} both/baseline"
    checks.append(_check("speedup", subject, float(both.ratio_median), min_speedup,
                         both.ratio_median >= min_speedup))
    checks.append(_check("speedup p10", subject, float(both.ratio_p10), min_speedup_p10,
                         both.ratio_p10 >= min_speedup_p10))
    return checks


def check_runs(tables: list[pd.DataFrame], max_spread: float = 0.10, ranks: int = 2,
               speedup_dataset: str = "mini_m", min_speedup: float = 3.0,
               min_speedup_p10: float = 2.7) -> pd.DataFrame:
    """Every run's checks (column `run`, from 1), then whether the order of the variants at
    `ranks` is the same in all runs, per data set."""
    rows = [{"run": k, **c} for k, table in enumerate(tables, start=1)
            for c in check_run(table, max_spread, ranks, speedup_dataset, min_speedup,
                               min_speedup_p10)]
    for dataset in dict.fromkeys(tables[0][tables[0].ranks == ranks].dataset):
        orders = [" > ".join(order_at(t, dataset, ranks)) for t in tables]
        rows.append({"run": "all", **_check("same ordering", f"{dataset} r{ranks}",
                                            " | ".join(dict.fromkeys(orders)), "one order",
                                            len(set(orders)) == 1)})
    return pd.DataFrame(rows)


def _shown(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def report_times(results: list[Path]) -> None:
    """Each run's variants' epoch times with their min-max over the rounds (not judged)."""
    for k, folder in enumerate(results, start=1):
        for path in sorted(folder.glob(f"train/*/r*/{RoundRecord.TABLE}")):
            rounds = read_rounds(path)
            for variant, times in rounds.groupby(RoundRecord.col.variant, sort=False).epoch_s:
                print(f"run {k:>3}  epoch time    {path.parent.parent.name} "
                      f"{path.parent.name} {variant:9s} {times.median():8.3f} s "
                      f"({times.min():.3f}-{times.max():.3f} s, not judged)")


def run(args: argparse.Namespace) -> int:
    """Print the checks; 0 if all passed, 1 if not."""
    try:
        checks = check_runs([read_groups(p) for p in args.results], args.max_spread, args.ranks,
                            args.speedup_dataset, args.min_speedup, args.min_speedup_p10)
    except ValueError as err:
        raise SystemExit(f"cfmtrain goals: {err}") from None
    for row in checks.itertuples():
        print(f"run {row.run:>3}  {row.check:13s} {row.subject:32s} {_shown(row.value):>12} "
              f"(limit {_shown(row.limit)})  {'ok' if row.passed else 'FAILED'}")
    report_times(args.results)
    failed = int((~checks.passed.astype(bool)).sum())
    if args.output:
        with atomic_path(args.output) as tmp:
            checks.to_csv(tmp, index=False)
    print(f"{len(checks) - failed} of {len(checks)} checks passed over {len(args.results)} "
          f"run(s)" + ("" if not failed else f"; {failed} FAILED"), file=sys.stderr)
    return 1 if failed else 0
