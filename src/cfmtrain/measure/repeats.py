"""`cfmtrain cell --repeats N --ranks R -- train ... --output CELL`: one training cell, measured
N times. One `cfmtrain launch` runs `train --repeats N`: the same ranks train the run N times,
each afresh, into CELL/rep1 ... CELL/repN (one process start per cell, not per repeat: ~5 s
each of interpreter, torch and mace-torch imports saved). A repeat whose own measures show the
host disturbed it (train.contention: compute wall/CPU, steal, CPU time on identical work; the
speed probe, a sample of the host at its ends, flags but does not re-measure) is re-measured:
up to --remeasure more repeats (CELL/rep<N+1> ...), one launch per round, until N undisturbed
ones are there, and after the first round only while they fit in --remeasure-seconds (a cheap
cell gets several chances, an expensive one one). CELL/summary.json then holds the
median epoch time over the N repeats it uses with their min and max, every repeat's contention
measures and verdict (the replaced ones too, `used` false), and the rest of the median
repeat's summary, whose outputs (final.model, steps.csv, epochs.csv, test_mae.csv,
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
from cfmtrain.dist import contention
from cfmtrain.dist.launch import run_child, summary_written

# A repeat's outputs that the cell's folder keeps at its top level (readers of a cell use them).
PUBLISHED = ("final.model", "steps.csv", "epochs.csv", "test_mae.csv", "config.json")
HOST_KEYS = ("loadavg_start", "loadavg_end", "steal_start", "steal_end")
PROBE_KEYS = ("probe_start_s", "probe_end_s")  # the slowest rank's speed probe


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
    parser.add_argument("--remeasure", type=int, default=1,
                        help="at most this many more repeats replace disturbed ones (compute "
                             "wall/CPU, steal, CPU time; not the speed probe), so that the cell "
                             "reports --repeats undisturbed ones if the host allows "
                             "(default 1; 0: report the first --repeats whatever their flags)")
    parser.add_argument("--remeasure-seconds", type=float, default=math.inf,
                        help="and only while they fit in this many seconds: the first "
                             "re-measure always runs, a later one only if the re-measures so "
                             "far and it (timed as the cell's repeats so far, start-up "
                             "included) take no longer (default: no time limit)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- followed by the `cfmtrain train` arguments, with --output")


def cell_command(command: list[str], repeats: int, remeasure: int = 0,
                 remeasure_seconds: float = math.inf) -> Path:
    """The cell folder of the `train` command (checked: `cfmtrain cell` adds `--repeats`)."""
    if command[:1] != ["train"] or "--output" not in command[:-1]:
        raise ValueError("give the `train` command with its --output after `--`, e.g. "
                         "`cfmtrain cell --ranks 2 -- train --graphs G --split S --output CELL`")
    if "--repeats" in command or "--first-repeat" in command:
        raise ValueError("give the repeats to `cfmtrain cell --repeats`, not to `train`")
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    if remeasure < 0:
        raise ValueError(f"--remeasure must be at least 0, got {remeasure}")
    if not remeasure_seconds >= 0:
        raise ValueError(f"--remeasure-seconds must be at least 0, got {remeasure_seconds}")
    return Path(command[command.index("--output") + 1])


def remeasure_count(missing: int, budget: int, spent_s: float, per_repeat_s: float,
                    seconds: float) -> int:
    """How many repeats the next re-measure round runs (0: none): the `missing` undisturbed
    ones, at most `budget` (the re-measures left of --remeasure) and, once re-measures took
    `spent_s`, only as many as fit in `seconds` at `per_repeat_s` each; the first round always
    runs one (a cell whose repeat alone exceeds the budget gets one chance, not none)."""
    count = min(missing, budget)
    if count <= 0:
        return 0
    timed = math.isfinite(seconds) and per_repeat_s > 0
    fit = int((seconds - spent_s) // per_repeat_s) if timed else count
    return min(count, max(fit, 1 if spent_s == 0 else 0))


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
    # its own measures (not the probe, a sample of the host at its ends) show it disturbed
    slowed = contention.verdict(host["wall_cpu_ratio"], steal, limits, math.nan, cpu_slowdown)
    return {"repeat": k, "epoch_time_s": _number(summary["epoch_time_s"]),
            "cpu_time_s": host["cpu_time_s"], "wall_cpu_ratio": host["wall_cpu_ratio"],
            **{key: host[key] for key in HOST_KEYS}, "steal_fraction": steal,
            "probe_s": _probe(host), "probe_slowdown": probe_slowdown,
            "cpu_slowdown": cpu_slowdown,
            "contended": bool(why), "contended_because": why, "remeasure": bool(slowed),
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


def used_repeats(records: list[dict], wanted: int) -> list[int]:
    """Indices of the repeats whose epoch times the cell reports, in repeat order: the first
    `wanted` that need no re-measure (`remeasure` false: their compute wall/CPU, steal and CPU
    time on identical work within the limits), filled up with the others of least CPU
    slowdown."""
    clean = [i for i, r in enumerate(records) if not r["remeasure"]][:wanted]
    if len(clean) < wanted:
        def least_slowed(i: int) -> tuple[float, int]:
            slow = records[i]["cpu_slowdown"]
            return (slow if math.isfinite(slow) else math.inf, i)

        rest = sorted((i for i, r in enumerate(records) if r["remeasure"]), key=least_slowed)
        clean += rest[:wanted - len(clean)]
    return sorted(clean)


def aggregate(summaries: list[dict], limits: contention.Thresholds,
              wanted: int | None = None) -> tuple[dict, int]:
    """(the cell's summary, the index of its median repeat) from its repeats' summaries, in
    repeat order. The cell reports `wanted` of them (default all; `used_repeats`: a repeat its
    own measures show disturbed is replaced by a later one, a re-measure): epoch_time_s is the
    median of their epoch times (the mean of the two middle ones for an even count),
    epoch_time_min_s/max_s their range; other keys are the median repeat's (the lower middle
    one for an even count). `repeats` lists every repeat, each `used` or not."""
    hosts = [repeat_host(s) for s in summaries]
    slowdowns = contention.slowdowns([[host[k] for k in PROBE_KEYS] for host in hosts])
    cpu = contention.slowdowns([[host["cpu_time_s"]] for host in hosts])
    records = [repeat_record(k, s, limits, slow, cpu_slow) for k, (s, slow, cpu_slow)
               in enumerate(zip(summaries, slowdowns, cpu, strict=True), start=1)]
    if not all(math.isfinite(r["epoch_time_s"]) for r in records):
        bad = [r["repeat"] for r in records if not math.isfinite(r["epoch_time_s"])]
        raise ValueError(f"repeats {bad} have no epoch time (no epoch trained?)")
    used = used_repeats(records, len(records) if wanted is None else wanted)
    for i, record in enumerate(records):
        record["used"] = i in used
    times = np.array([records[i]["epoch_time_s"] for i in used])
    middle = used[int(np.argsort(times, kind="stable")[(len(times) - 1) // 2])]
    cell = {key: v for key, v in summaries[middle].items() if key != "host"}
    cell.update({"epoch_time_s": float(np.median(times)), "epoch_time_min_s": float(times.min()),
                 "epoch_time_max_s": float(times.max()), "repeats": records,
                 "repeats_used": [records[i]["repeat"] for i in used],
                 "remeasured": len(records) - len(used),
                 "contended": any(records[i]["contended"] for i in used),
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
    """Train the repeats (one launch), re-measure disturbed ones (one more launch per round,
    --remeasure repeats at most), then write the cell's outputs; the launch's exit code (143
    after SIGTERM, 1 if it exited 0) if a repeat did not finish."""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    try:
        limits = contention.Thresholds(args.max_wall_cpu_ratio, args.max_steal_fraction,
                                       args.max_probe_slowdown, args.max_cpu_slowdown)
        folder = cell_command(command, args.repeats, args.remeasure, args.remeasure_seconds)
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
    budget, count = args.remeasure, args.repeats
    elapsed = spent = 0.0  # seconds of every launch so far, of the re-measures among them
    while True:
        started = time.monotonic()
        code, stopped = train_repeats(launch, command, folder, summaries, count)
        took = time.monotonic() - started
        elapsed += took
        if len(summaries) > args.repeats:  # a re-measure round
            spent += took
        if code:
            return code
        if stopped:  # a SIGTERM after complete repeats: no re-measure, the cell as it stands
            budget = 0
        try:
            cell, middle = aggregate(summaries, limits, args.repeats)
        except ValueError as err:
            print(f"cfmtrain cell: {folder}: {err}", file=sys.stderr)
            return 1
        missing = args.repeats - sum(not r["remeasure"] for r in cell["repeats"])
        count = remeasure_count(missing, budget, spent, elapsed / len(summaries),
                                args.remeasure_seconds)
        if count <= 0:
            break
        budget -= count
        flagged = [r["repeat"] for r in cell["repeats"] if r["remeasure"]]
        print(f"cfmtrain cell: repeats {flagged} disturbed; re-measuring {count} more "
              f"(rep{len(summaries) + 1}...)", file=sys.stderr, flush=True)
    cell["remeasure_time_s"] = spent
    publish(folder / f"rep{middle + 1}", folder)
    write_json(folder / "summary.json", cell)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # complete: a late stop must not fail it
    flagged = [r["repeat"] for r in cell["repeats"] if r["contended"] and r["used"]]
    print(f"cfmtrain cell: {folder}: epoch {cell['epoch_time_s']:.3f} s (median of repeats "
          f"{cell['repeats_used']}, {cell['epoch_time_min_s']:.3f}-"
          f"{cell['epoch_time_max_s']:.3f} s)"
          + (f"; contended repeats {flagged}" if flagged else ""), file=sys.stderr)
    return 0


def train_repeats(launch: list[str], command: list[str], folder: Path, summaries: list[dict],
                  count: int) -> tuple[int, bool]:
    """Train `count` more repeats of the cell (one launch) after the `summaries` read so far,
    appending theirs; (0, or the exit code to end the cell with if one did not finish;
    whether a SIGTERM came)."""
    first = len(summaries) + 1
    since = time.time()
    code, stopped = run_child([*launch, *command, "--repeats", str(count),
                               "--first-repeat", str(first)])
    for k in range(first, first + count):
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
