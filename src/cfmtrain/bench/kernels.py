"""`cfmtrain bench kernels`: the fused symmetric contraction, conv and whole model against
mace-torch (e3nn path) and torch.compile of it.

Each configuration (op, implementation, atoms, dtype, pass) runs in its own subprocess; its peak
memory is the child's ru_maxrss, and a child that runs out of memory or crashes is recorded so.
Rows also carry the largest relative difference of what was computed from mace-torch's row, and
for the fused rows (every pass) the GFLOP/s of the FLOPs the step executes (bench/flops.py)
against a matmul peak measured in the same run (rows with impl "matmul-peak", on the library the
fused ops use for the dtype: oneDNN for float32, torch.matmul for float64).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from cfmtrain import children
from cfmtrain.bench.settings import PRESET, preset_name
from cfmtrain.malloc_env import MALLOC_ENV

OPS = ("symmetric_contraction", "conv", "model")
IMPLS = ("fused", "mace", "compile", "fused_compile")
PASSES = ("forward", "forward_backward", "train_step")
AXES = ("ops", "models", "cg", "atoms", "dtypes", "passes", "impls")
# A preset is a list of sub-matrices (the product of each one's axes); "models" defaults to the
# paper's size. Every run also measures the matmul peak of each dtype it uses (GFLOP/s column).
PRESETS: dict[str, dict] = {
    # the default target's (a few minutes on 2 cores): each op and a whole step, small size
    "quick": {"reps": 5, "rounds": 5, "matrices": [
        {"ops": OPS, "impls": ("fused", "mace"), "atoms": (96,), "dtypes": ("float32",),
         "passes": ("train_step",), "cg": ("original",)}]},
    # the paper's model size, 800 atoms, float32, double backward (3072: --atoms);
    # the whole step compiled too (about a minute of compiling, seconds from inductor's cache)
    "paper-model": {"reps": 5, "rounds": 7, "matrices": [
        {"ops": OPS, "impls": ("fused", "mace"), "atoms": (800,), "dtypes": ("float32",),
         "passes": ("train_step",), "cg": ("original",)},
        {"ops": ("model",), "impls": ("fused_compile",), "atoms": (800,),
         "dtypes": ("float32",), "passes": ("train_step",), "cg": ("original",)}]},
    # Every op, pass and dtype, estimated at ~40 min on 2 quiet cores (from timings at
    # 8-200 atoms): op rows at 200 and 800 atoms for every pass and dtype; the whole training
    # step at 200/800/3072 atoms in float32 (3072: the memory story) and 200 in float64; the
    # reduced CG basis for the symmetric contraction alone; torch.compile of the ops at 200
    # atoms where it runs: its aot_autograd has no double backward (no train_step rows), and
    # inductor's backward of the e3nn conv with edge-attribute gradients corrupts the heap in
    # torch 2.13 (no conv forward_backward row). The whole model under torch.compile: "compile".
    "full": {"reps": 5, "rounds": 5, "matrices": [
        {"ops": ("symmetric_contraction", "conv"), "impls": ("fused", "mace"),
         "atoms": (200, 800), "dtypes": ("float32", "float64"), "passes": PASSES,
         "cg": ("original",)},
        {"ops": ("model",), "impls": ("fused", "mace"), "atoms": (200, 800, 3072),
         "dtypes": ("float32",), "passes": ("train_step",), "cg": ("original",)},
        {"ops": ("model",), "impls": ("fused", "mace"), "atoms": (200,),
         "dtypes": ("float64",), "passes": ("train_step",), "cg": ("original",)},
        {"ops": ("symmetric_contraction",), "impls": ("fused", "mace"), "atoms": (200, 800),
         "dtypes": ("float32",), "passes": PASSES, "cg": ("reduced",)},
        {"ops": ("symmetric_contraction",), "impls": ("compile",), "atoms": (200,),
         "dtypes": ("float32",), "passes": ("forward", "forward_backward"),
         "cg": ("original",)},
        {"ops": ("conv",), "impls": ("compile",), "atoms": (200,), "dtypes": ("float32",),
         "passes": ("forward",), "cg": ("original",)}]},
    # the whole training step under torch.compile, mace-torch's ("compile") and the fused
    # model's ("fused_compile", kernels.compile); compiling takes minutes
    "compile": {"reps": 5, "rounds": 5, "matrices": [
        {"ops": ("model",), "impls": ("mace", "fused", "compile", "fused_compile"),
         "atoms": (800,),
         "dtypes": ("float32",), "passes": ("train_step",), "cg": ("original",)}]},
}
DEFAULT_AXES = {"models": ("paper",)}
MATMUL_SIZE = 3072
# OpenMP threads that spin at barriers lose whole time slices when the 2 cores are shared (measured:
# a 96-atom training step 9.4 s spinning, 0.46 s passive): passive for every implementation,
# unless the caller's environment sets the policy.
OMP_WAIT_POLICY = "passive"
# numpy's OpenBLAS threads, woken in every `MACECalculator` step by mace-torch's neighbour
# shifts (np.dot of [edges, 3] by the cell), then spin on the cores torch computes on (measured,
# an MP-0-medium MD step on 1k water with one against two, 8 interleaved pairs each: 1.11x with
# OpenMP's default spinning waits, 1.03x with the passive ones set here): one for every
# implementation, unless the caller's environment sets it. torch's own BLAS is MKL, unaffected.
OPENBLAS_NUM_THREADS = "1"
CHILD_ENV = {"OMP_WAIT_POLICY": OMP_WAIT_POLICY, "OPENBLAS_NUM_THREADS": OPENBLAS_NUM_THREADS}
OOM_MARKERS = ("can't allocate memory", "MemoryError", "out of memory", "std::bad_alloc")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Preset, output paths and optional subsets of the configuration matrix."""
    parser.add_argument("--preset", choices=sorted(PRESETS), default=PRESET,
                        type=preset_name("kernels"),
                        help=f"default: the default target's ({PRESET})")
    parser.add_argument("--output", help="CSV (default results/bench/kernels_<preset>.csv)")
    parser.add_argument("--figure", help="PNG (default results/figures/fig_kernels_<preset>.png)")
    parser.add_argument("--ops", nargs="+", choices=OPS)
    parser.add_argument("--impls", nargs="+", choices=IMPLS)
    parser.add_argument("--atoms", nargs="+", type=int)
    parser.add_argument("--dtypes", nargs="+", choices=("float32", "float64"))
    parser.add_argument("--passes", nargs="+", choices=PASSES)
    parser.add_argument("--cg", nargs="+", choices=("original", "reduced"),
                        help="CG basis: mace's original one or the reduced (cuequivariance) one")
    parser.add_argument("--models", nargs="+", choices=("paper", "tiny"),
                        help="model size: the paper's, or a tiny one to test the harness")
    parser.add_argument("--reps", type=_reps, help="timed repetitions (median reported, >= 5)")
    parser.add_argument("--rounds", type=int, help="paired rounds of fused against mace-torch "
                        "per configuration, both in one process (`bench compare`; 0: none)")
    parser.add_argument("--matmul-size", type=int, default=MATMUL_SIZE,
                        help="n of the n x n matmul whose GFLOP/s is the peak")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per config")
    parser.add_argument("--memory-limit-gb", type=float, default=None,
                        help="address-space limit per child (default 85%% of RAM)")


def _reps(text: str) -> int:
    reps = int(text)
    if reps < 5:
        raise argparse.ArgumentTypeError(f"must be at least 5 (a median of >= 5), got {reps}")
    return reps


def _configs(args: argparse.Namespace) -> list[dict]:
    """The preset's configurations (CLI axes replace the preset's in every sub-matrix), each
    once, in the preset's order; preceded by a matmul-peak row per dtype used."""
    preset = PRESETS[args.preset]
    reps = args.reps or preset["reps"]
    if reps < 5:
        raise ValueError(f"--reps must be at least 5 (a median of >= 5), got {reps}")
    configs: list[dict] = []
    for matrix in preset["matrices"]:
        pick = {k: getattr(args, k, None) or matrix.get(k) or DEFAULT_AXES[k] for k in AXES}
        for op, model, cg, atoms, dtype, kind, impl in itertools.product(*pick.values()):
            if impl == "fused_compile" and op != "model":
                continue  # it compiles the whole fused model only
            config = {"op": op, "model": model, "cg": cg, "impl": impl, "atoms": atoms,
                      "dtype": dtype, "pass": kind, "reps": reps}
            if config not in configs:
                configs.append(config)
    dtypes = dict.fromkeys(c["dtype"] for c in configs)
    peaks = [{"op": "matmul", "model": "", "cg": "", "impl": "matmul-peak", "atoms": None,
              "dtype": dtype, "pass": "forward", "reps": reps,
              "size": getattr(args, "matmul_size", MATMUL_SIZE)} for dtype in dtypes]
    return peaks + configs


def memory_limit(gigabytes: float | None) -> int:
    """Bytes of address space per child: `gigabytes`, or 85% of RAM."""
    if gigabytes is not None:
        return int(gigabytes * 2**30)
    return int(0.85 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def run_child(config: dict, timeout: float, limit: int,
              module: str = "cfmtrain.bench.kernels") -> dict:
    """Run one configuration in a subprocess (`python -m <module> <config as JSON>`, which
    prints a JSON line); returns its result with peak memory and status (ok, oom, timeout or
    crash: <last line of stderr>)."""
    env = {**CHILD_ENV, **os.environ, **MALLOC_ENV}
    cmd = [sys.executable, "-m", module, json.dumps(config)]

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = children.Popen(cmd, stdout=out, stderr=err, env=env, preexec_fn=limit_memory)
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


def _rel_diff(row: dict, ref: dict) -> float:
    """Largest difference of two fingerprints ({name: [norm, projection]}) relative to the
    reference's norm of the same tensor; NaN if either is missing or they name other tensors."""
    a, b = row.get("fingerprint"), ref.get("fingerprint")
    if not a or not b or set(a) != set(b):
        return float("nan")
    worst = 0.0
    for name, (norm_b, proj_b) in b.items():
        norm_a, proj_a = a[name]
        diff = max(abs(norm_a - norm_b), abs(proj_a - proj_b))
        worst = max(worst, diff / norm_b if norm_b else (0.0 if diff == 0 else float("inf")))
    return worst


def _add_speedups(rows: list[dict]) -> None:
    """Against mace-torch's row of the same model, op, CG basis, size, dtype and pass: speedup
    (its median / this median) and max_rel_diff_vs_mace (of the computed results); gflop_s of
    the rows with a FLOP count (the fused ones, every pass), and pct_of_matmul_peak (this run's
    peak of the dtype)."""
    key = ("op", "model", "cg", "atoms", "dtype", "pass")
    ok = [r for r in rows if r.get("status") == "ok"]
    mace = {tuple(r.get(k) for k in key): r for r in ok if r["impl"] == "mace"}
    for r in rows:
        ref = mace.get(tuple(r.get(k) for k in key))
        good = r.get("status") == "ok" and ref is not None
        r["speedup_vs_mace"] = ref["median_s"] / r["median_s"] if good else float("nan")
        r["max_rel_diff_vs_mace"] = _rel_diff(r, ref) if good else float("nan")
        flops = r.get("flops") if r.get("status") == "ok" else None
        r["gflop_s"] = flops / r["median_s"] / 1e9 if flops else float("nan")
    peak = {r["dtype"]: r["gflop_s"] for r in ok if r["impl"] == "matmul-peak"}
    for r in rows:
        r["pct_of_matmul_peak"] = 100.0 * r["gflop_s"] / peak.get(r["dtype"], float("nan"))


PAIRED = ("ratio_median", "ratio_p10", "ratio_p90", "rounds")


def add_paired(rows: list[dict], rounds: int, timeout: float) -> None:
    """On each fused row with a mace-torch row of the same configuration (original CG basis):
    the paired speed-up over mace-torch (PAIRED columns), from `cfmtrain bench compare` in a
    subprocess: both arms in one process, `rounds` alternating rounds of one call each."""
    key = ("op", "model", "cg", "atoms", "dtype", "pass")
    mace = {tuple(r.get(k) for k in key) for r in rows
            if r["impl"] == "mace" and r.get("status") == "ok"}
    for r in rows:
        r.update(dict.fromkeys(PAIRED, float("nan")))
        if not (rounds and r["impl"] == "fused" and r.get("status") == "ok"
                and r["cg"] == "original" and tuple(r.get(k) for k in key) in mace):
            continue
        with tempfile.TemporaryDirectory(prefix="cfmtrain-paired-") as tmp:
            csv = Path(tmp) / "compare.csv"
            done = children.run(
                [sys.executable, "-m", "cfmtrain", "bench", "compare", "--op", r["op"],
                 "--arms", "mace", "fused", "--atoms", str(r["atoms"]), "--dtype", r["dtype"],
                 "--pass", r["pass"], "--model", r["model"], "--rounds", str(rounds),
                 "--calls", "1", "--csv", str(csv)], env={**CHILD_ENV, **os.environ,
                                                          **MALLOC_ENV},
                capture_output=True, text=True, timeout=timeout)
            if done.returncode:
                tail = (done.stdout + done.stderr).strip().splitlines()[-1:]
                print(f"paired rounds of {r['op']} {r['pass']} at {r['atoms']} atoms failed: "
                      f"{tail}", flush=True)
                continue
            import pandas as pd  # lazy: not in the children

            fused = pd.read_csv(csv).set_index("arm").loc["fused"]
        r.update({k: float(fused[k]) for k in PAIRED})


COLUMNS = ["op", "model", "cg", "impl", "atoms", "edges", "dtype", "pass", "status", "median_s",
           "min_s", "median_cpu_s", "reps", "compile_s", "peak_rss_mb", "speedup_vs_mace",
           *PAIRED, "max_rel_diff_vs_mace", "flops", "gflop_s", "pct_of_matmul_peak", "threads",
           "omp_wait_policy", "openblas_threads", "backend"]


def run(args: argparse.Namespace) -> int:
    """Run every configuration of the preset, write the CSV and the figure."""
    from cfmtrain.bench.table import report  # lazy: not in the children (pandas)
    from cfmtrain.plots.kernels import draw_kernels  # lazy: not in the children (matplotlib)

    output = Path(args.output or f"results/bench/kernels_{args.preset}.csv")
    figure = Path(args.figure or f"results/figures/fig_kernels_{args.preset}.png")
    limit = memory_limit(args.memory_limit_gb)
    rows = []
    with tempfile.TemporaryDirectory(prefix="cfmtrain-bench-kernels-") as cache:
        for config in _configs(args):
            row = run_child({**config, "cache_dir": cache}, args.timeout, limit)
            row.pop("cache_dir")
            print(json.dumps({k: row.get(k) for k in ("op", "model", "cg", "impl", "atoms",
                                                      "dtype", "pass", "status", "median_s",
                                                      "peak_rss_mb")}), flush=True)
            rows.append(row)
    _add_speedups(rows)
    rounds = PRESETS[args.preset]["rounds"] if args.rounds is None else args.rounds
    add_paired(rows, rounds, args.timeout)
    table = report([{c: r.get(c) for c in COLUMNS} for r in rows], output,
                   "Fused kernels vs mace-torch (median seconds per call)")
    draw_kernels(table[table.impl != "matmul-peak"], figure)
    return 0


if __name__ == "__main__":
    from cfmtrain.bench.kernels_worker import main

    sys.exit(main(json.loads(sys.argv[1])))
