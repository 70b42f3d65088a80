"""The generic build of the fused ops against the tuned ones (cfmtrain.kernels.isa), in one run.

The fused rows of a `cfmtrain bench kernels` preset, each configuration run in paired rounds
(measure.paired): once per ISA variant and round, in an order shuffled per round. Every run is
a subprocess with CFMTRAIN_CPU_ARCH naming its variant, which reports the variant it loaded.
The CSV has a row per configuration and variant: the median over rounds of each run's median
seconds (wall and CPU), the speed-up against the generic build as the median of the per-round
ratios (`ratio_p10`, `ratio_p90` its range; the same for CPU seconds), and the largest
difference of the results from the generic build's (relative to their norm).

    cfmtrain bench isa --preset quick --rounds 2   # -> results/bench/isa_quick.csv
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

from cfmtrain import children
from cfmtrain.bench.kernels import CHILD_ENV, PASSES, PRESETS, _configs, _rel_diff
from cfmtrain.bench.kernels_worker import setup, time_step
from cfmtrain.bench.table import report
from cfmtrain.kernels import isa
from cfmtrain.malloc_env import MALLOC_ENV
from cfmtrain.measure.paired import Ratio, run_rounds

COLUMNS = ["op", "model", "atoms", "edges", "dtype", "pass", "variant", "median_s", "min_s",
           "median_cpu_s", "rounds", "reps", "speedup_vs_generic", "ratio_median", "ratio_p10",
           "ratio_p90", "cpu_speedup_vs_generic", "max_rel_diff_vs_generic"]


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
    proc = children.run([sys.executable, "-m", "cfmtrain.bench.isa", json.dumps(config)],
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
    """A row per configuration and variant from its runs (one per paired round, in round
    order), compared with the generic build's round by round."""
    rows = []
    for index, config in enumerate(configs):
        group = [{**config, "variant": variant, "edges": results[0]["edges"],
                  "rounds": len(results),
                  "median_s": statistics.median(r["median_s"] for r in results),
                  "min_s": min(r["min_s"] for r in results),
                  "median_cpu_s": statistics.median(r["median_cpu_s"] for r in results),
                  "fingerprint": results[0]["fingerprint"], "runs": results}
                 for (i, variant), results in runs.items() if i == index]
        generic = next((r for r in group if r["variant"] == isa.GENERIC), None)
        for row in group:
            if generic is None:
                row.update(speedup_vs_generic=math.nan, cpu_speedup_vs_generic=math.nan,
                           max_rel_diff_vs_generic=math.nan)
                continue
            wall, cpu = (Ratio.of([g[key] / r[key] for g, r in zip(generic["runs"], row["runs"],
                                                                   strict=True)])
                         for key in ("median_s", "median_cpu_s"))
            row.update(wall.columns(), speedup_vs_generic=wall.median,
                       cpu_speedup_vs_generic=cpu.median,
                       max_rel_diff_vs_generic=_rel_diff(row, generic))
        rows += group
    return rows


def run(args: argparse.Namespace) -> int:
    """Run each fused configuration of the preset in paired rounds of its variants; write the
    CSV."""
    if args.reps is not None and args.reps < 5:
        raise ValueError(f"--reps must be at least 5 (a median of >= 5), got {args.reps}")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    variants = args.variants or built_variants()
    picked = argparse.Namespace(**{**vars(args), "impls": ("fused",), "cg": None})
    configs = [c for c in _configs(picked) if c["op"] != "matmul"]
    runs: dict[tuple, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="cfmtrain-bench-isa-") as cache:
        for index, config in enumerate(configs):
            def arm(variant: str, index: int = index, config: dict = config):
                def once() -> float:
                    result = _run_one({**config, "cache_dir": cache}, variant, args.timeout)
                    runs.setdefault((index, variant), []).append(result)
                    print(json.dumps({"op": config["op"], "variant": variant,
                                      "median_s": result["median_s"]}), flush=True)
                    return result["median_s"]
                return once

            if len(variants) > 1:
                run_rounds({v: arm(v) for v in variants}, args.rounds, seed=index)
            else:  # nothing to pair with: its runs alone
                for _ in range(args.rounds):
                    arm(variants[0])()
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
