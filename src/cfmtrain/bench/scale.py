"""`cfmtrain bench scale`: the data path against the graph count, stage by stage.

For each `--graphs` count it generates the crystals preset (shard by shard, in parallel),
builds the graph shards (one `cfmtrain graphs` process per shard, `--workers` at a time), splits
them and trains `both` on `--ranks` ranks for `--steps` steps, each stage as the pipeline runs it
(the project's own commands, in subprocesses). A row per count and stage gives its wall time,
its peak RSS (the largest single process, from the kernel's accounting; for training, the
largest rank's), the PSS summed over the training ranks at the end of training, the disk it
wrote, and on the `steps` row the share of step time spent waiting for data.

`open`: opening the store (GraphStore, as a training rank does), every count's store once a
round in shuffled order after all are built; its seconds are the median over the rounds, and
`ratio_*` the median and 10-90% range of the per-round time against the next smaller count.
Stages from the training run's timeline.json: `statistics` (E0s, mean, std, neighbours, and
the model's construction), `first_step` (from `cfmtrain launch` to the end of the first
step), `steps` (the timed steps after the first) and `epoch_overhead` (the per-epoch plan:
sampler, balancer and loader; `epoch_share` is its share of the epoch's projected time, steps
per epoch x median step time). `graphs_2_processes`, at the smallest
count: graph building in 2 processes against 1, as the median of paired rounds with its 10-90%
range (ideal: 2).

`--from-pipeline DIR` reads the same rows from the jobs of the Snakemake target `scale` (which
fans the data sets' graph shards out as job arrays under Slurm): generate, graphs and split from
their `benchmark:` files (graphs: the summed time of its shard jobs; peak RSS over a job's
processes), the training stages from `results/scale/scale_<count>/`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from cfmtrain import children
from cfmtrain.bench.scale_settings import ScaleSettings
from cfmtrain.bench.table import report
from cfmtrain.graphs.store import GraphStore
from cfmtrain.measure.paired import Ratio, run_rounds
from cfmtrain.paper import BOTH
from cfmtrain.plots.scale import draw_scale
from cfmtrain.settings import add_settings, from_args
from cfmtrain.tables import Record, read_table
from cfmtrain.train.steps import StepRecord

STAGES = ("generate", "graphs", "split", "open", "statistics", "first_step", "steps",
          "epoch_overhead")


@dataclasses.dataclass(frozen=True)
class ScaleRow(Record):
    """One stage at one graph count (the module docstring says what each stage times): seconds,
    peak RSS and the training ranks' summed PSS (GB), disk written (GB), the shares of data wait
    (`steps`) and of the epoch (`epoch_overhead`), and a paired ratio with its rounds (`open`,
    `graphs_2_processes`); NaN where a stage has no value."""

    graphs: int
    stage: str
    seconds: float
    peak_rss_gb: float
    pss_gb_all_ranks: float
    disk_gb: float
    data_wait_share: float
    epoch_share: float
    ratio_median: float
    ratio_p10: float
    ratio_p90: float
    rounds: float

    TABLE = "scale table"
    WRITER = "`cfmtrain bench scale`"


COLUMNS = ScaleRow.columns()
ORDER = (*STAGES[:2], "graphs_2_processes", *STAGES[2:])  # the table's rows per count
MODEL = ('model.hidden_irreps="16x0e+16x1o"', "model.max_ell=2", "model.correlation=3",
         "model.radial_mlp=[32, 32]")
GB = 1e9


def _cfmtrain(*words: object) -> list[str]:
    return [sys.executable, "-m", "cfmtrain", *map(str, words)]


def timed(command: list[str], log: Path) -> dict:
    """Run `command` (output to `log`); its wall time and the peak RSS of its largest process
    (wait4's ru_maxrss covers the waited-for descendants). A failure raises, naming the log."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = children.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)  # Popen.wait would not return the usage
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}); see {log}")
    return {"seconds": time.perf_counter() - t0, "peak_rss_gb": usage.ru_maxrss * 1024 / GB}


def disk_gb(path: Path) -> float:
    """Bytes under `path`, in GB."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / GB


def build_graphs(frames: Path, graphs: Path, logs: Path, workers: int) -> dict:
    """One `cfmtrain graphs` process per frames shard, `workers` at a time: the stage's wall
    time and its largest job's peak RSS."""
    shards = sorted(frames.glob("frames_*.extxyz"))
    t0 = time.perf_counter()

    def one(source: Path) -> dict:
        k = source.stem.split("_")[1]
        return timed(_cfmtrain("graphs", "--input", source, "--output",
                               graphs / f"shard_{k}.h5", "--dataset", "scale"),
                     logs / f"graphs_{k}.log")

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        jobs = list(pool.map(one, shards))
    return {"seconds": time.perf_counter() - t0,
            "peak_rss_gb": max(j["peak_rss_gb"] for j in jobs)}


def graph_scaling(frames: Path, scratch: Path, logs: Path, rounds: int) -> dict:
    """Graph throughput from 1 to 2 processes, in paired rounds: one frames shard built twice,
    one build after the other against both at once; the ratio is the speed-up of the pair."""
    source = sorted(frames.glob("frames_*.extxyz"))[0]

    def builds(*shards: int) -> None:
        """`cfmtrain graphs` of `source` into each of `shards`, all at once, waited for."""
        with contextlib.ExitStack() as stack:
            procs = [children.Popen(
                _cfmtrain("graphs", "--input", source, "--output", scratch / f"shard_{k}.h5",
                          "--dataset", "scale"),
                stdout=stack.enter_context(open(logs / f"scaling_{k}.log", "w")),
                stderr=subprocess.STDOUT) for k in shards]
            if any(p.wait() for p in procs):
                raise RuntimeError(f"cfmtrain graphs failed; see {logs}/scaling_*.log")

    def one_after_other() -> None:
        builds(0)
        builds(1)

    result = run_rounds({"1 process": one_after_other, "2 processes": lambda: builds(0, 1)},
                        rounds)
    shutil.rmtree(scratch, ignore_errors=True)
    return {"stage": "graphs_2_processes",
            "seconds": float(np.median(result.times("2 processes"))),
            **result.ratio("1 process", "2 processes").columns()}


def training_rows(run: Path) -> list[dict]:
    """The stages read from a run's timeline.json and steps.csv (module docstring)."""
    timeline = json.loads((run / "timeline.json").read_text())
    steps = read_table(run / StepRecord.TABLE, StepRecord)
    timed_steps = steps[steps.step > 0]  # the first step pays one-time costs
    data, step = timed_steps.data_s, timed_steps.step_s
    rank0 = timed_steps[timed_steps[StepRecord.col.rank] == 0].step_s
    plan = float(np.median(timeline["epoch_plan_s"]))
    epoch = timeline["steps_per_epoch"] * float(rank0.median())
    memory = {k: timeline[k] for k in ("peak_rss_gb", "pss_gb_all_ranks")}
    return [
        {"stage": "statistics", "seconds": timeline["statistics_s"]},
        {"stage": "first_step", "seconds": timeline["first_step_at"] - timeline["launched_at"],
         **memory},
        {"stage": "steps", "seconds": float(rank0.sum()),
         "data_wait_share": float(data.sum() / (data.sum() + step.sum())), **memory},
        {"stage": "epoch_overhead", "seconds": plan, "epoch_share": plan / epoch},
    ]


def _open(path: Path) -> None:
    GraphStore(path)


def open_rows(stores: dict[int, Path], rounds: int) -> list[dict]:
    """The `open` row of each count: opening its store (GraphStore, as a training rank does),
    every count once per round in shuffled order; the median seconds, and against the next
    smaller count the median of the per-round time ratios with its 10-90% range."""
    counts = sorted(stores)
    arms = {count: functools.partial(_open, stores[count]) for count in counts}
    if len(counts) == 1:  # one arm: paired against itself, for the same median
        arms = {counts[0]: arms[counts[0]], -1: arms[counts[0]]}
    result = run_rounds(arms, rounds, warmup=1)
    rows = []
    for k, count in enumerate(counts):
        growth = (Ratio.of(result.times(count) / result.times(counts[k - 1])).columns()
                  if k else {})
        rows.append({"graphs": count, "stage": "open",
                     "seconds": float(np.median(result.times(count))), **growth})
    return rows


def train_overrides(steps: int) -> list[str]:
    """The `train` options of the timed run: `steps` steps of one epoch, the reduced model."""
    return [w for s in (f"max_steps={steps}", "epochs=1", "threads=1", "progress=false", *MODEL)
            for w in ("--set", s)]


def job_benchmarks(*files: Path) -> dict:
    """Stage seconds (summed over the jobs) and the largest job's peak RSS (all its processes)
    from Snakemake `benchmark:` files; a missing file raises, naming it."""
    tables = [pd.read_csv(f, sep="\t") for f in files]
    return {"seconds": float(sum(t.s.sum() for t in tables)),
            "peak_rss_gb": max(float(t.max_rss.max()) for t in tables) * 2**20 / GB}


def pipeline_rows(count: int, root: Path) -> list[dict]:
    """The rows of `count` graphs from the `scale` target's jobs run under `root` (the
    Snakemake working directory), data set `scale_<count>`: generate, graphs (its shard jobs'
    summed time) and split from the jobs' benchmark files, training from its run folder."""
    name, bench = f"scale_{count}", root / "benchmarks"
    shards = sorted((bench / "graphs" / name).glob("shard_*.tsv"))
    if not shards:
        raise FileNotFoundError(f"{bench / 'graphs' / name}: no benchmark of a graph job")
    rows = [{"stage": "generate", **job_benchmarks(bench / "frames" / f"{name}.tsv"),
             "disk_gb": disk_gb(root / "results/data" / name / "frames")},
            {"stage": "graphs", **job_benchmarks(*shards),
             "disk_gb": disk_gb(root / "results/graphs" / name)},
            {"stage": "split", **job_benchmarks(bench / "split" / f"{name}.tsv")},
            *training_rows(root / "results/scale" / name)]
    return table_rows(count, rows)


def table_rows(count: int, rows: list[dict]) -> list[dict]:
    """`rows` of one count with every column (NaN where a stage has no value)."""
    return [ScaleRow.of({**row, "graphs": count}).row() for row in rows]


def measure(count: int, work: Path, steps: int, ranks: int, workers: int,
            shard_graphs: int, scaling_rounds: int = 0) -> list[dict]:
    """Every stage's row at `count` graphs, built under `work/<count>` (replaced)."""
    root = work / str(count)
    shutil.rmtree(root, ignore_errors=True)
    logs, frames, graphs, run = root / "logs", root / "frames", root / "graphs", root / "run"
    logs.mkdir(parents=True)
    shards = max(1, -(-count // shard_graphs))
    rows = []
    gen = timed(_cfmtrain("generate", "--preset", "crystals", "--graphs", count,
                          "--num-shards", shards, "--workers", workers, "--output-dir", frames),
                logs / "generate.log")
    rows.append({"stage": "generate", **gen, "disk_gb": disk_gb(frames)})
    rows.append({"stage": "graphs", **build_graphs(frames, graphs, logs, workers),
                 "disk_gb": disk_gb(graphs)})
    if scaling_rounds:
        rows.append(graph_scaling(frames, root / "scaling", logs, scaling_rounds))
    split = timed(_cfmtrain("split", "--graphs", graphs, "--output", graphs / "split.npz",
                            "--valid", 0.01, "--test", 0.01, "--seed", 0), logs / "split.log")
    rows.append({"stage": "split", **split})
    timed(_cfmtrain("launch", "--ranks", ranks, "--threads", 1, "train", "--graphs", graphs,
                    "--split", graphs / "split.npz", "--output", run, "--variant", BOTH.name,
                    "--dataset", "scale", *train_overrides(steps)), logs / "train.log")
    return table_rows(count, rows + training_rows(run))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain bench scale`."""
    parser.add_argument("--work", type=Path, default=Path("results/bench/scale"),
                        help="folder for the generated data (default results/bench/scale)")
    parser.add_argument("--output", type=Path, default=Path("results/bench/scale.csv"))
    parser.add_argument("--figure", type=Path, default=Path("results/figures/fig_scale.png"))
    parser.add_argument("--keep", action="store_true", help="keep the data of each count")
    parser.add_argument("--from-pipeline", type=Path, metavar="DIR",
                        help="collect the rows from the jobs of the Snakemake target `scale` "
                        "run in DIR instead of running the stages (no graphs_2_processes row)")
    add_settings(parser, ScaleSettings)


def run(args: argparse.Namespace) -> int:
    """Measure (or collect) each count, then print and write the table and draw the figure."""
    s = from_args(ScaleSettings, args)
    rows, stores = [], {}
    counts = sorted(set(s.graphs))
    if counts[0] < 100:
        print(f"error: --graphs {counts[0]}: at least 100 graphs", file=sys.stderr)
        return 2
    for count in counts:
        if args.from_pipeline:
            rows += pipeline_rows(count, args.from_pipeline)
            stores[count] = args.from_pipeline / "results/graphs" / f"scale_{count}"
            continue
        rows += measure(count, args.work, s.steps, s.ranks, s.workers,
                        s.shard_graphs, s.scaling_rounds if count == counts[0] else 0)
        stores[count] = args.work / str(count) / "graphs"
        for part in ("frames", "run") if not args.keep else ():  # graphs: for the open rounds
            shutil.rmtree(args.work / str(count) / part, ignore_errors=True)
    rows += [table_rows(r["graphs"], [r])[0] for r in open_rows(stores, s.open_rounds)]
    rows.sort(key=lambda r: (r["graphs"], ORDER.index(r["stage"])))
    if not args.keep and not args.from_pipeline:
        for count in counts:
            shutil.rmtree(args.work / str(count), ignore_errors=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    table = report(rows, args.output, f"data path at scale: crystals, `both` on {s.ranks} "
                   f"ranks, {s.steps} steps")
    draw_scale(table, args.figure, STAGES)
    print(f"wrote {args.figure}")
    return 0
