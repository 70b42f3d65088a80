"""`cfmtrain goals RESULTS ...`: the ablation's goals, checked on the training
cells (RESULTS/train/<data set>/<variant>/r<ranks>/summary.json; the four ablation variants)
of one or more consecutive `make run`s, each run's `results` folder (or a copy of it):
- every cell's min-max spread is at most --max-spread of its median;
- at --ranks (2), on every data set, `both` is the fastest variant and `kernel` and `balancer`
  are each at least as fast as `baseline`, and the order of the variants is the same in every
  run given;
- `both`/`baseline` on --speedup-dataset at --ranks is at least --min-speedup.
It prints one line per run and check, writes them to --output (CSV) if given, and exits 1 if
any check fails. Whether `all` stayed within its time limit is not in the table: time the runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from cfmtrain.atomic import atomic_path
from cfmtrain.paper import ABLATION
from cfmtrain.plots.cells import cells_table, speedup_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `cfmtrain goals`."""
    parser.add_argument("results", nargs="+", type=Path,
                        help="each run's results folder, in the order they ran")
    parser.add_argument("--max-spread", type=float, default=0.10,
                        help="largest (max - min) / median of a cell (default 0.10)")
    parser.add_argument("--ranks", type=int, default=2,
                        help="rank count whose variants are ordered (default 2)")
    parser.add_argument("--speedup-dataset", default="mini_m",
                        help="data set of the both/baseline goal (default mini_m)")
    parser.add_argument("--min-speedup", type=float, default=3.0,
                        help="least both/baseline speed-up there (default 3.0)")
    parser.add_argument("--output", type=Path, help="write the checks to this CSV")


def read_cells(results: Path) -> pd.DataFrame:
    """The ablation cells of one run's results folder as Figure 6's table (speed-ups over each
    group's baseline); a folder without cells is an error naming it."""
    paths = sorted(p for p in results.glob("train/*/*/r*/summary.json")
                   if p.parts[-3] in ABLATION)
    if not paths:
        raise ValueError(f"{results}: no training cells (train/<data set>/<variant>/r<ranks>/"
                         "summary.json of baseline, balancer, kernel or both)")
    return speedup_table(cells_table(paths), "cfmtrain goals")


def order_at(table: pd.DataFrame, dataset: str, ranks: int) -> list[str]:
    """The variants of one data set at `ranks`, fastest (least median epoch time) first."""
    rows = table[(table.dataset == dataset) & (table.ranks == ranks)]
    return list(rows.sort_values("epoch_time_s", kind="stable").variant)


def check_run(table: pd.DataFrame, max_spread: float, ranks: int, speedup_dataset: str,
              min_speedup: float) -> list[dict]:
    """One run's checks: rows of (check, subject, value, limit, passed)."""
    checks = []
    for row in table.itertuples():
        spread = (row.epoch_time_max_s - row.epoch_time_min_s) / row.epoch_time_s
        checks.append({"check": "spread", "subject": f"{row.dataset} r{row.ranks} {row.variant}",
                       "value": spread, "limit": max_spread, "passed": spread <= max_spread})
    for dataset in dict.fromkeys(table[table.ranks == ranks].dataset):
        order = order_at(table, dataset, ranks)
        if not set(ABLATION) <= set(order):
            raise ValueError(f"{dataset} at {ranks} ranks: the table has {order}, not all of "
                             f"{list(ABLATION)}")
        times = table[(table.dataset == dataset) & (table.ranks == ranks)].set_index(
            "variant").epoch_time_s
        passed = (order[0] == "both" and times["kernel"] <= times["baseline"]
                  and times["balancer"] <= times["baseline"])
        checks.append({"check": "ordering", "subject": f"{dataset} r{ranks}",
                       "value": " < ".join(order), "limit": "both first; kernel, balancer "
                       "<= baseline", "passed": passed})
    both = table[(table.dataset == speedup_dataset) & (table.ranks == ranks)
                 & (table.variant == "both")]
    if both.empty:
        raise ValueError(f"no `both` cell of {speedup_dataset} at {ranks} ranks in the table")
    value = float(both.speedup.iloc[0])
    checks.append({"check": "speedup", "subject": f"{speedup_dataset} r{ranks} both/baseline",
                   "value": value, "limit": min_speedup, "passed": value >= min_speedup})
    return checks


def check_runs(tables: list[pd.DataFrame], max_spread: float = 0.10, ranks: int = 2,
               speedup_dataset: str = "mini_m", min_speedup: float = 3.0) -> pd.DataFrame:
    """Every run's checks (column `run`, from 1), then whether the order of the variants at
    `ranks` is the same in all runs, per data set."""
    rows = [{"run": k, **c} for k, table in enumerate(tables, start=1)
            for c in check_run(table, max_spread, ranks, speedup_dataset, min_speedup)]
    for dataset in dict.fromkeys(tables[0][tables[0].ranks == ranks].dataset):
        orders = [" < ".join(order_at(t, dataset, ranks)) for t in tables]
        rows.append({"run": "all", "check": "same ordering", "subject": f"{dataset} r{ranks}",
                     "value": " | ".join(dict.fromkeys(orders)), "limit": "one order",
                     "passed": len(set(orders)) == 1})
    return pd.DataFrame(rows)


def _shown(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def run(args: argparse.Namespace) -> int:
    """Print the checks; 0 if all passed, 1 if not."""
    try:
        checks = check_runs([read_cells(p) for p in args.results], args.max_spread, args.ranks,
                            args.speedup_dataset, args.min_speedup)
    except ValueError as err:
        raise SystemExit(f"cfmtrain goals: {err}") from None
    for row in checks.itertuples():
        print(f"run {row.run:>3}  {row.check:13s} {row.subject:28s} {_shown(row.value):>12} "
              f"(limit {_shown(row.limit)})  {'ok' if row.passed else 'FAILED'}")
    failed = int((~checks.passed.astype(bool)).sum())
    if args.output:
        with atomic_path(args.output) as tmp:
            checks.to_csv(tmp, index=False)
    print(f"{len(checks) - failed} of {len(checks)} checks passed over {len(args.results)} "
          f"run(s)" + ("" if not failed else f"; {failed} FAILED"), file=sys.stderr)
    return 1 if failed else 0
