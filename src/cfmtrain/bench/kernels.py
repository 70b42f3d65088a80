"""`cfmtrain bench kernels`: the fused symmetric contraction, conv and whole model against
mace-torch (e3nn path) and torch.compile of it.

Each configuration (op, implementation, atoms, dtype, pass) runs in its own subprocess; its peak
memory is the child's ru_maxrss, and a child that runs out of memory or crashes is recorded so.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cfmtrain.malloc_env import MALLOC_ENV

OPS = ("symmetric_contraction", "conv", "model")
IMPLS = ("fused", "mace", "compile")
PASSES = ("forward", "forward_backward", "train_step")
PRESETS = {
    # the default target's (a few minutes on 2 cores): each op and a whole step, small size
    "quick": {"ops": OPS, "impls": ("fused", "mace"), "atoms": (96,), "dtypes": ("float32",),
              "passes": ("train_step",), "cg": ("original",), "reps": 5},
    # the issues' goals: the paper's size, 800 atoms, float32, double backward (3072: --atoms)
    "goals": {"ops": OPS, "impls": ("fused", "mace"), "atoms": (800,), "dtypes": ("float32",),
              "passes": ("train_step",), "cg": ("original",), "reps": 5},
    "full": {"ops": OPS, "impls": IMPLS, "atoms": (200, 800, 3072),
             "dtypes": ("float32", "float64"), "passes": PASSES, "cg": ("original", "reduced"),
             "reps": 5},
}
# OpenMP threads that spin at barriers lose whole time slices when the 2 cores are shared (measured:
# a 96-atom training step 9.4 s spinning, 0.46 s passive): passive for every implementation,
# unless the caller's environment sets the policy.
OMP_WAIT_POLICY = "passive"
OOM_MARKERS = ("can't allocate memory", "MemoryError", "out of memory", "std::bad_alloc")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Preset, output paths and optional subsets of the configuration matrix."""
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument("--output", help="CSV (default results/bench/kernels_<preset>.csv)")
    parser.add_argument("--figure", help="PNG (default results/figures/fig_kernels_<preset>.png)")
    parser.add_argument("--ops", nargs="+", choices=OPS)
    parser.add_argument("--impls", nargs="+", choices=IMPLS)
    parser.add_argument("--atoms", nargs="+", type=int)
    parser.add_argument("--dtypes", nargs="+", choices=("float32", "float64"))
    parser.add_argument("--passes", nargs="+", choices=PASSES)
    parser.add_argument("--cg", nargs="+", choices=("original", "reduced"),
                        help="CG basis: mace's original one or the reduced (cuequivariance) one")
    parser.add_argument("--reps", type=int, help="timed repetitions (median reported, >= 5)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per config")
    parser.add_argument("--memory-limit-gb", type=float, default=None,
                        help="address-space limit per child (default 85%% of RAM)")


def _configs(args: argparse.Namespace) -> list[dict]:
    preset = PRESETS[args.preset]
    keys = ("ops", "impls", "atoms", "dtypes", "passes", "cg")
    pick = {k: getattr(args, k) or preset[k] for k in keys}
    reps = args.reps or preset["reps"]
    if reps < 5:
        raise ValueError(f"--reps must be at least 5 (a median of >= 5), got {reps}")
    return [{"op": op, "cg": cg, "impl": impl, "atoms": atoms, "dtype": dtype, "pass": kind,
             "reps": reps}
            for op, cg, atoms, dtype, kind, impl in itertools.product(*(pick[k] for k in (
                "ops", "cg", "atoms", "dtypes", "passes", "impls")))]


def _memory_limit(gigabytes: float | None) -> int:
    if gigabytes is not None:
        return int(gigabytes * 2**30)
    return int(0.85 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _run_child(config: dict, timeout: float, limit: int) -> dict:
    """Run one configuration in a subprocess; returns its result with peak memory and status."""
    env = {"OMP_WAIT_POLICY": OMP_WAIT_POLICY, **os.environ, **MALLOC_ENV}
    cmd = [sys.executable, "-m", "cfmtrain.bench.kernels", json.dumps(config)]

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, preexec_fn=limit_memory)
        start, status, usage = time.monotonic(), None, None
        while status is None:
            pid, wait_status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status = wait_status
            elif time.monotonic() - start > timeout:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                status = "timeout"
            else:
                time.sleep(0.2)
        proc.returncode = 0  # reaped by wait4 above; keep Popen from waiting again
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    row = {**config, "peak_rss_mb": usage.ru_maxrss / 1024.0}
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if status == "timeout":
        return {**row, "status": "timeout"}
    code = os.waitstatus_to_exitcode(status)
    if lines:
        return {**row, **json.loads(lines[-1])}
    if code == -9 or any(m in stderr for m in OOM_MARKERS):
        return {**row, "status": "oom"}
    last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit code {code}"
    return {**row, "status": f"crash: {last[:200]}"}


def _add_speedups(rows: list[dict]) -> None:
    """speedup = mace-torch's median / this row's median for the same op, size, dtype, pass."""
    key = ("op", "cg", "atoms", "dtype", "pass")
    mace = {tuple(r[k] for k in key): r.get("median_s") for r in rows
            if r["impl"] == "mace" and r.get("status") == "ok"}
    for r in rows:
        ref = mace.get(tuple(r[k] for k in key))
        ok = r.get("status") == "ok" and ref
        r["speedup_vs_mace"] = ref / r["median_s"] if ok else float("nan")


def run(args: argparse.Namespace) -> int:
    """Run every configuration of the preset, write the CSV and the figure."""
    from cfmtrain.bench.table import report

    output = Path(args.output or f"results/bench/kernels_{args.preset}.csv")
    figure = Path(args.figure or f"results/figures/fig_kernels_{args.preset}.png")
    limit = _memory_limit(args.memory_limit_gb)
    rows = []
    for config in _configs(args):
        row = _run_child(config, args.timeout, limit)
        print(json.dumps({k: row.get(k) for k in ("op", "cg", "impl", "atoms", "dtype", "pass",
                                                  "status", "median_s", "peak_rss_mb")}),
              flush=True)
        rows.append(row)
    _add_speedups(rows)
    columns = ["op", "cg", "impl", "atoms", "edges", "dtype", "pass", "status", "median_s", "min_s",
               "median_cpu_s", "reps", "compile_s", "peak_rss_mb", "speedup_vs_mace", "threads",
               "omp_wait_policy", "backend"]
    report([{c: r.get(c) for c in columns} for r in rows], output,
           "Fused kernels vs mace-torch (median seconds per call)")
    from cfmtrain.bench.kernels_figure import plot_kernels

    plot_kernels(rows, figure)
    return 0


if __name__ == "__main__":
    from cfmtrain.bench.kernels_worker import main

    sys.exit(main(json.loads(sys.argv[1])))
