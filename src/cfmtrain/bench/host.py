"""`cfmtrain bench host`: is this machine steady enough to take timings on?

A fixed piece of work (the cells' own speed probe, train.contention: `--calls` single-thread
float32 matmuls of `--size` squared matrices, then `--gathers` gathers of `--rows` random rows
from a table of as many) is timed `--probes` times, `--pause` seconds apart, with the CPU time
the hypervisor stole meanwhile (/proc/stat). On a steady host every probe takes the same time;
a busy neighbour on the same physical cores, or one that thrashes the shared cache, slows some
of them, which neither the load average nor a wall/CPU ratio shows (the thread runs, only
slower). The CSV has each part's time (`matmul_s`, `gather_s`) beside the total. The
spread (max - min) / median of the probes' wall times is compared with `--max-spread`: above it
the command says the host is unsteady and exits 1, so a script can wait before it runs
`make run` or a benchmark.

    cfmtrain bench host --probes 20   # -> results/bench/host.csv
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from cfmtrain.bench.table import report
from cfmtrain.ranks.contention import (
    PROBE_CALLS,
    PROBE_GATHERS,
    PROBE_ROWS,
    PROBE_SIZE,
    host_sample,
    probe_parts,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Probe count, pause, work per probe, output and the spread limit."""
    parser.add_argument("--probes", type=int, default=20, help="timed probes (>= 2)")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between probes")
    parser.add_argument("--calls", type=int, default=2 * PROBE_CALLS, help="matmuls per probe")
    parser.add_argument("--size", type=int, default=PROBE_SIZE, help="matrix side")
    parser.add_argument("--gathers", type=int, default=2 * PROBE_GATHERS,
                        help="row gathers per probe")
    parser.add_argument("--rows", type=int, default=PROBE_ROWS,
                        help="rows of the gathered table and of each gather")
    parser.add_argument("--max-spread", type=float, default=0.10,
                        help="largest (max - min) / median of the probes' wall times of a "
                             "steady host (default 0.10)")
    parser.add_argument("--output", default="results/bench/host.csv")


def spread(walls: list[float]) -> dict[str, float]:
    """Median, min, max of the wall times and their spread (max - min) / median."""
    median = statistics.median(walls)
    return {"median_s": median, "min_s": min(walls), "max_s": max(walls),
            "spread": (max(walls) - min(walls)) / median}


def run(args: argparse.Namespace) -> int:
    """Time the probes, write the CSV, print the verdict; 1 if the host is unsteady."""
    import torch

    if args.probes < 2 or min(args.calls, args.size, args.gathers, args.rows) < 1:
        raise SystemExit("cfmtrain bench host: --probes must be >= 2, --calls, --size, "
                         "--gathers and --rows >= 1")
    torch.set_num_threads(1)
    flops = 2.0 * args.size ** 3 * args.calls
    rows, origin = [], time.perf_counter()
    for k in range(args.probes):
        if k:
            time.sleep(args.pause)
        before, start = host_sample(), time.perf_counter() - origin
        parts = probe_parts(args.calls, args.size, args.gathers, args.rows)
        rows.append({"probe": k, "start_s": start,
                     "wall_s": parts["matmul_s"] + parts["gather_s"], "cpu_s": parts["cpu_s"],
                     "matmul_s": parts["matmul_s"], "gather_s": parts["gather_s"],
                     "gflop_s": flops / parts["matmul_s"] / 1e9,
                     "steal_s": host_sample()["steal"] - before["steal"]})
    report(rows, Path(args.output), f"Host probes: {args.calls} x {args.size}^2 float32 "
           f"matmuls, then {args.gathers} gathers of {args.rows} rows, on one thread")
    s = spread([r["wall_s"] for r in rows])
    steady = s["spread"] <= args.max_spread
    print(f"host {'steady' if steady else 'UNSTEADY'}: probes {s['min_s']:.3f}-{s['max_s']:.3f} s "
          f"(median {s['median_s']:.3f}), spread {100 * s['spread']:.1f}% "
          f"{'<=' if steady else '>'} {100 * args.max_spread:.0f}%"
          + ("" if steady else ": timings taken now can move by as much"))
    return 0 if steady else 1
