"""The generic build of the fused ops against the tuned ones (cfmtrain.kernels.isa), in one run.

The fused rows of a `cfmtrain bench kernels` preset, each configuration run once per ISA variant
in turn, for a few rounds: every run is a subprocess with CFMTRAIN_CPU_ARCH naming its variant,
which reports the variant it loaded. The CSV has a row per configuration and variant: the median
over rounds of each round's median seconds (wall and CPU), the speedups against the generic build
(CPU seconds move less than wall ones on a shared machine), and the largest difference of the
results from the generic build's (relative to their norm).

    cfmtrain bench isa --preset quick --rounds 2   # -> results/bench/isa_quick.csv
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from cfmtrain.bench.kernels import CHILD_ENV, PASSES, PRESETS, _configs, _rel_diff
from cfmtrain.bench.kernels_worker import setup, time_step
from cfmtrain.bench.table import report
from cfmtrain.kernels import isa
from cfmtrain.malloc_env import MALLOC_ENV

COLUMNS = ["op", "model", "atoms", "edges", "dtype", "pass", "variant", "median_s", "min_s",
           "median_cpu_s", "rounds", "reps", "speedup_vs_generic", "cpu_speedup_vs_generic",
           "max_rel_diff_vs_generic"]


def built_variants() -> list[str]:
    """generic, then every tuned variant this CPU supports whose op libraries are all built."""
    import importlib.util

    libraries = ("cfmtrain._ops_symmetric_contraction", "cfmtrain._ops_channelwise_conv")
    return [isa.GENERIC] + [
        v for v in isa.supported_variants(isa.cpu_flags())
        if all(importlib.util.find_spec(isa.module_name(lib, v)) for lib in libraries)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Preset and subsets of its matrix (as `cfmtrain bench kernels`), variants and rounds."""
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument("--output", help="CSV (default results/bench/isa_<preset>.csv)")
    parser.add_argument("--ops", nargs="+", choices=("symmetric_contraction", "conv", "model"))
    parser.add_argument("--atoms", nargs="+", type=int)
    parser.add_argument("--dtypes", nargs="+", choices=("float32", "float64"))
    parser.add_argument("--passes", nargs="+", choices=PASSES)
    parser.add_argument("--models", nargs="+", choices=("paper", "tiny"))
    parser.add_argument("--reps", type=int, help="timed repetitions per run (>= 5)")
    parser.add_argument("--variants", nargs="+", choices=(isa.GENERIC, *isa.VARIANTS),
                        help="default: generic and every built variant this CPU runs")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each configuration")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")


def _run_one(config: dict, variant: str, timeout: float) -> dict:
    """One configuration in a subprocess loading `variant`; its timing, or a RuntimeError with
    the child's last error line."""
    env = {**CHILD_ENV, **os.environ, **MALLOC_ENV, isa.ENV: variant}
    proc = subprocess.run([sys.executable, "-m", "cfmtrain.bench.isa", json.dumps(config)],
                          env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise RuntimeError(f"{config['op']} with {isa.ENV}={variant}: {last}")
    result = json.loads(lines[-1])
    if result["variant"] != variant:
        raise RuntimeError(f"{isa.ENV}={variant} loaded {result['variant']}")
    return result


def _summarise(runs: dict[tuple[int, str], list[dict]], configs: list[dict]) -> list[dict]:
    """A row per configuration and variant from its runs, compared with the generic build's."""
    rows = []
    for index, config in enumerate(configs):
        group = [{**config, "variant": variant, "edges": results[0]["edges"],
                  "rounds": len(results),
                  "median_s": statistics.median(r["median_s"] for r in results),
                  "min_s": min(r["min_s"] for r in results),
                  "median_cpu_s": statistics.median(r["median_cpu_s"] for r in results),
                  "fingerprint": results[0]["fingerprint"]}
                 for (i, variant), results in runs.items() if i == index]
        generic = next((r for r in group if r["variant"] == isa.GENERIC), None)
        for row in group:
            for col, key in (("speedup_vs_generic", "median_s"),
                             ("cpu_speedup_vs_generic", "median_cpu_s")):
                row[col] = generic[key] / row[key] if generic else float("nan")
            row["max_rel_diff_vs_generic"] = _rel_diff(row, generic) if generic else float("nan")
        rows += group
    return rows


def run(args: argparse.Namespace) -> int:
    """Run each fused configuration of the preset once per variant and round; write the CSV."""
    if args.reps is not None and args.reps < 5:
        raise ValueError(f"--reps must be at least 5 (a median of >= 5), got {args.reps}")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    variants = args.variants or built_variants()
    picked = argparse.Namespace(**{**vars(args), "impls": ("fused",), "cg": None})
    configs = [c for c in _configs(picked) if c["op"] != "matmul"]
    runs: dict[tuple, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="cfmtrain-bench-isa-") as cache:
        for round_ in range(args.rounds):
            for index, config in enumerate(configs):
                for variant in variants:  # interleaved: load drifts hit every variant alike
                    result = _run_one({**config, "cache_dir": cache}, variant, args.timeout)
                    runs.setdefault((index, variant), []).append(result)
                    print(json.dumps({"round": round_, "op": config["op"], "variant": variant,
                                      "median_s": result["median_s"]}), flush=True)
    output = Path(args.output or f"results/bench/isa_{args.preset}.csv")
    rows = _summarise(runs, configs)
    report([{c: r.get(c) for c in COLUMNS} for r in rows], output,
           "Fused ops by ISA variant (median seconds per call)")
    return 0


def child(config: dict) -> int:
    """Time `config` in this process; print its result and the variant loaded as one JSON line."""
    step, facts = setup(config)
    result = {**facts, **time_step(step, config["reps"]), "variant": isa.cpu_variant()}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(child(json.loads(sys.argv[1])))
