"""`cfmtrain cell --repeats N --ranks R -- train ... --output CELL`: one training cell, measured
N times. One `cfmtrain launch` runs `train --repeats N`: the same ranks train the run N times,
each afresh, into CELL/rep1 ... CELL/repN (one process start per cell, not per repeat: ~5 s
each of interpreter, torch and mace-torch imports saved). CELL/summary.json then holds the
median epoch time over the repeats with their min and max, every repeat's contention measures
and flag (information: compute wall/CPU, steal, the speed probe and CPU time on identical work;
the ablation's speed-ups come from paired rounds, `cfmtrain rounds`), and the rest of the
median repeat's summary, whose outputs (final.model, steps.csv, epochs.csv, test_mae.csv,
config.json) are copied to CELL.

The command's `--resume auto` applies to every repeat: a finished repeat (its summary.json
written) trains afresh, so running the cell again (Snakemake's --forcerun) re-measures all of
them; a repeat stopped part-way (SIGTERM, preemption) continues from its checkpoint. A SIGTERM
ends the training at the next step (checkpoint) or, after a complete repeat, before the next.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np

from cfmtrain.atomic import atomic_path
from cfmtrain.ranks import contention
from cfmtrain.ranks.launch import run_child, summary_written
from cfmtrain.train.runs import RunSummary, epoch_times

# A repeat's outputs that the cell's folder keeps at its top level (readers of a cell use them).
PUBLISHED = ("final.model", "steps.csv", "epochs.csv", "test_mae.csv", "config.json")
HOST_KEYS = ("loadavg_start", "loadavg_end", "steal_start", "steal_end")
PROBE_KEYS = ("probe_start_s", "probe_end_s")  # the slowest rank's speed probe
S = RunSummary.col  # summary.json's keys that other stages read


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `cfmtrain cell`; everything after `--` is the `cfmtrain train` command."""
    limits = contention.Thresholds()
    parser.add_argument("--repeats", type=int, default=3, help="runs of the cell (default 3)")
    parser.add_argument("--ranks", type=int, required=True, help="ranks of each run")
    parser.add_argument("--threads", type=int, default=None, help="threads per rank (launch)")
    parser.add_argument("--srun-args", default="", help="extra srun options (launch)")
    parser.add_argument("--max-wall-cpu-ratio", type=float, default=limits.max_wall_cpu_ratio,
                        help="a repeat whose compute wall/CPU time exceeds this is contended "
                             f"(default {limits.max_wall_cpu_ratio})")
    parser.add_argument("--max-steal-fraction", type=float, default=limits.max_steal_fraction,
                        help="a repeat during which the hypervisor stole more than this share "
                             f"of the CPU time is contended (default {limits.max_steal_fraction})")
    parser.add_argument("--max-probe-slowdown", type=float, default=limits.max_probe_slowdown,
                        help="a repeat whose speed probe (fixed matmul and gather work at its "
                             "start and end) ran slower than the cell's fastest by more than "
                             f"this share is contended (default {limits.max_probe_slowdown})")
    parser.add_argument("--max-cpu-slowdown", type=float, default=limits.max_cpu_slowdown,
                        help="a repeat whose compute CPU time exceeds the cell's least (the "
                             "repeats do identical work) by more than this share is contended "
                             f"(default {limits.max_cpu_slowdown})")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- followed by the `cfmtrain train` arguments, with --output")


def cell_command(command: list[str], repeats: int) -> Path:
    """The cell folder of the `train` command (checked: `cfmtrain cell` adds `--repeats`)."""
    if command[:1] != ["train"] or "--output" not in command[:-1]:
        raise ValueError("give the `train` command with its --output after `--`, e.g. "
                         "`cfmtrain cell --ranks 2 -- train --graphs G --split S --output CELL`")
    if "--repeats" in command:
        raise ValueError("give the repeats to `cfmtrain cell --repeats`, not to `train`")
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    return Path(command[command.index("--output") + 1])


def _number(value) -> float:
    """A JSON number, NaN for null (write_json writes NaN as null)."""
    return math.nan if value is None else float(value)


def repeat_record(k: int, summary: dict, limits: contention.Thresholds,
                  probe_slowdown: float = math.nan, cpu_slowdown: float = math.nan) -> dict:
    """One repeat's entry of the cell's `repeats`: its epoch time, contention measures (with
    its speed probe's slowdown against the cell's fastest, and its compute CPU time's against
    the cell's least) and verdict (`contended`, and
    `contended_because` saying which threshold it crossed), and the epochs it resumed part-way
    (their time spans two processes)."""
    host = repeat_host(summary)
    steal = contention.steal_fraction(host)
    why = contention.verdict(host["wall_cpu_ratio"], steal, limits, probe_slowdown, cpu_slowdown)
    return {"repeat": k, S.epoch_time_s: _number(summary[S.epoch_time_s]),
            "cpu_time_s": host["cpu_time_s"], "wall_cpu_ratio": host["wall_cpu_ratio"],
            **{key: host[key] for key in HOST_KEYS}, "steal_fraction": steal,
            "probe_s": _probe(host), "probe_slowdown": probe_slowdown,
            "cpu_slowdown": cpu_slowdown,
            S.contended: bool(why), "contended_because": why,
            "resumed_epochs": summary.get("resumed_epochs", [])}


def repeat_host(summary: dict) -> dict[str, float]:
    """A repeat's host measures (NaN where its summary has none, e.g. an older one)."""
    host = {key: _number(v) for key, v in (summary.get("host") or {}).items()}
    needed = (*HOST_KEYS, "cpu_total_start", "cpu_total_end", "cpu_time_s", "wall_cpu_ratio",
              *PROBE_KEYS)
    return {key: host.get(key, math.nan) for key in needed}


def _probe(host: dict[str, float]) -> float:
    """The slower of a repeat's start and end probes (the slowest rank's), NaN if unknown."""
    known = [host[k] for k in PROBE_KEYS if math.isfinite(host[k])]
    return max(known) if known else math.nan


def aggregate(summaries: list[dict], limits: contention.Thresholds) -> tuple[dict, int]:
    """(the cell's summary, the index of its median repeat) from its repeats' summaries, in
    repeat order: epoch_time_s is the median of their epoch times (the mean of the two middle
    ones for an even count), epoch_time_min_s/max_s their range; other keys are the median
    repeat's (the lower middle one for an even count). `repeats` lists every repeat with its
    contention measures and flag."""
    hosts = [repeat_host(s) for s in summaries]
    slowdowns = contention.slowdowns([[host[k] for k in PROBE_KEYS] for host in hosts])
    cpu = contention.slowdowns([[host["cpu_time_s"]] for host in hosts])
    records = [repeat_record(k, s, limits, slow, cpu_slow) for k, (s, slow, cpu_slow)
               in enumerate(zip(summaries, slowdowns, cpu, strict=True), start=1)]
    if not all(math.isfinite(r[S.epoch_time_s]) for r in records):
        bad = [r["repeat"] for r in records if not math.isfinite(r[S.epoch_time_s])]
        raise ValueError(f"repeats {bad} have no epoch time (no epoch trained?)")
    times = np.array([r[S.epoch_time_s] for r in records])
    middle = int(np.argsort(times, kind="stable")[(len(times) - 1) // 2])
    cell = {key: v for key, v in summaries[middle].items() if key != "host"}
    cell.update({**epoch_times(times), S.repeats: records,
                 S.contended: any(r[S.contended] for r in records),
                 "outputs_of_repeat": middle + 1,
                 "contention_thresholds": dataclasses.asdict(limits)})
    return cell, middle


def publish(source: Path, folder: Path) -> None:
    """Copy a repeat's outputs to the cell folder's top level, each atomically."""
    for name in PUBLISHED:
        with atomic_path(folder / name) as tmp:
            shutil.copyfile(source / name, tmp)


def read_summary(path: Path) -> dict:
    """A repeat's summary.json; an unreadable one is an error naming it."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read the repeat's summary ({err})") from None


def run(args: argparse.Namespace) -> int:
    """Train the repeats (one launch), then write the cell's outputs; the launch's exit code
    (143 after SIGTERM, 1 if it exited 0) if a repeat did not finish."""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    try:
        limits = contention.Thresholds(args.max_wall_cpu_ratio, args.max_steal_fraction,
                                       args.max_probe_slowdown, args.max_cpu_slowdown)
        folder = cell_command(command, args.repeats)
    except ValueError as err:
        raise SystemExit(f"cfmtrain cell: {err}") from None
    from cfmtrain.train.checkpoint import CHECKPOINT, PREVIOUS  # lazy: torch, once args are checked
    from cfmtrain.train.summary import write_json  # lazy: torch, once args are checked

    for stale in (CHECKPOINT, PREVIOUS):  # of a run trained in the cell folder itself
        (folder / stale).unlink(missing_ok=True)
    launch = [sys.executable, "-m", "cfmtrain", "launch", "--ranks", str(args.ranks),
              f"--srun-args={args.srun_args}",
              *(["--threads", str(args.threads)] if args.threads else []), "--"]
    print(f"cfmtrain cell: {args.repeats} repeat(s) into {folder}/rep<k>", file=sys.stderr,
          flush=True)
    summaries: list[dict] = []
    code, _ = train_repeats(launch, command, folder, summaries, args.repeats)
    if code:
        return code
    try:
        cell, middle = aggregate(summaries, limits)
    except ValueError as err:
        print(f"cfmtrain cell: {folder}: {err}", file=sys.stderr)
        return 1
    publish(folder / f"rep{middle + 1}", folder)
    write_json(folder / "summary.json", cell)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # complete: a late stop must not fail it
    flagged = [r["repeat"] for r in cell[S.repeats] if r[S.contended]]
    print(f"cfmtrain cell: {folder}: epoch {cell[S.epoch_time_s]:.3f} s (median of "
          f"{len(summaries)} repeats, {cell[S.epoch_time_min_s]:.3f}-"
          f"{cell[S.epoch_time_max_s]:.3f} s)"
          + (f"; contended repeats {flagged}" if flagged else ""), file=sys.stderr)
    return 0


def train_repeats(launch: list[str], command: list[str], folder: Path, summaries: list[dict],
                  count: int) -> tuple[int, bool]:
    """Train the cell's `count` repeats (one launch), appending their summaries; (0, or the
    exit code to end the cell with if one did not finish; whether a SIGTERM came)."""
    since = time.time()
    code, stopped = run_child([*launch, *command, "--repeats", str(count)])
    for k in range(1, count + 1):
        rep = folder / f"rep{k}"
        done = None if code else summary_written(rep, since)
        if done is None:
            then = ("running the cell again continues it from its checkpoint"
                    if (rep / "checkpoint.pt").exists() else
                    "it left no checkpoint: see the error above; running the cell again starts "
                    "the repeat afresh")
            print(f"cfmtrain cell: repeat {k} ({rep}) did not finish (exit "
                  f"{code}{', SIGTERM' if stopped else ''}); {then}", file=sys.stderr, flush=True)
            return code or (143 if stopped else 1), stopped
        summaries.append(read_summary(done))
    return 0, stopped
