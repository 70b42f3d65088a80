"""`cfmtrain bench md`: molecular dynamics through mace-torch's `MACECalculator`, cfmtrain's
fused kernels against mace-torch's own code, and optionally against Symmetrix-XL (`--impls ...
symmetrix`, `pip install .[peers]`), in one run.

Each configuration (system, model shape, atoms, implementation) runs in its own subprocess
(bench/md_worker.py): velocity Verlet at 1 fs, every step one energy+forces+stress call with its
neighbour list, as `MACECalculator` does it (Symmetrix-XL's calculator: the forces the step asks
for, its own neighbour list with a skin). The CSV has per configuration the median, min and max
seconds per step, µs per atom and step, steps/s, ns/day, the one-time costs (`convert_s`:
Symmetrix-XL's converter; `setup_s`: model to calculator, Symmetrix-XL's JIT compile included;
`first_call_s`), peak memory, the speed-up against mace-torch's row of the same system, shape
and size, and how far the first call's energy and forces are from it. A fused row also has the
paired speed-ups, over mace-torch (`ratio_*`, `rounds`) and over Symmetrix-XL
(`ratio_vs_symmetrix_*`): a further child runs every arm and alternates one MD step of each in
shuffled rounds.

    cfmtrain bench md --preset paper-model   # -> results/bench/md_paper-model.csv, its figure
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path

from cfmtrain.bench.kernels import PAIRED, memory_limit, run_child
from cfmtrain.bench.md_worker import PEERS_EXTRA, SHAPES, SYSTEMS, symmetrix_missing
from cfmtrain.bench.settings import preset_name
from cfmtrain.bench.table import report

IMPLS = ("fused", "mace", "symmetrix")
ORDER = ("mace", "fused", "symmetrix")  # the order configurations run in
DEFAULT_IMPLS = ("mace", "fused")  # the peers only when asked for
# the paired columns of the fused row, per other arm: its speed-up over that arm
RATIOS = ("ratio_median", "ratio_p10", "ratio_p90")
PAIRED_VS = {"mace": RATIOS, "symmetrix": tuple(k.replace("ratio", "ratio_vs_symmetrix")
                                                for k in RATIOS)}
AXES = ("systems", "shapes", "atoms", "impls")
PRESETS: dict[str, dict] = {
    # the test suite's: the harness end to end in seconds
    "test": {"systems": ("fcc", "water"), "shapes": ("tiny",), "atoms": (100,), "steps": 3,
             "rounds": 2},
    # the paper's model shape (MP-0 medium) at 5k atoms, both systems
    "paper-model": {"systems": ("fcc", "water"), "shapes": ("mp0-medium",), "atoms": (5000,),
              "steps": 5, "rounds": 5},
    # the full preset: 1k, 5k and 20k atoms, small and medium shapes
    "full": {"systems": ("fcc", "water"), "shapes": ("mp0-small", "mp0-medium"),
             "atoms": (1000, 5000, 20000), "steps": 5, "rounds": 5},
}
COLUMNS = ["system", "shape", "impl", "target_atoms", "atoms", "dtype", "status", "steps",
           "median_step_s", "min_step_s", "max_step_s", "median_cpu_s", "us_per_atom",
           "convert_s", "setup_s", "first_call_s", "steps_per_s", "ns_per_day",
           "speedup_vs_mace", *PAIRED, *PAIRED_VS["symmetrix"], "peak_rss_mb", "rss_vs_mace",
           "energy_rel_diff_vs_mace", "forces_rel_diff_vs_mace", "threads", "omp_wait_policy",
           "openblas_threads", "backend"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Preset, output paths and optional subsets of its matrix."""
    parser.add_argument("--preset", choices=sorted(PRESETS), default="paper-model",
                        type=preset_name("md"))
    parser.add_argument("--output", help="CSV (default results/bench/md_<preset>.csv)")
    parser.add_argument("--figure", help="PNG (default results/figures/fig_md_<preset>.png)")
    parser.add_argument("--systems", nargs="+", choices=sorted(SYSTEMS))
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES))
    parser.add_argument("--atoms", nargs="+", type=int, help="about this many atoms per system")
    parser.add_argument("--impls", nargs="+", choices=IMPLS,
                        help="default: mace fused; symmetrix: Symmetrix-XL's calculator of the "
                        f"converted model (optional: {PEERS_EXTRA})")
    parser.add_argument("--steps", type=int, help="timed MD steps (median reported, >= 3)")
    parser.add_argument("--rounds", type=int, help="paired rounds of one MD step, fused against "
                        "every other arm in one process (default: the preset's; 0: none)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all CPUs)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per config")
    parser.add_argument("--memory-limit-gb", type=float, default=None,
                        help="address-space limit per child (default 85%% of RAM)")


def configs(args: argparse.Namespace) -> list[dict]:
    """The preset's configurations, CLI axes replacing the preset's, mace-torch's first."""
    import os

    preset = PRESETS[args.preset]
    steps = args.steps or preset["steps"]
    if steps < 3:
        raise ValueError(f"--steps must be at least 3 (a median of >= 3), got {steps}")
    threads = args.threads or len(os.sched_getaffinity(0))
    pick = {k: getattr(args, k, None) or preset.get(k, DEFAULT_IMPLS) for k in AXES}
    pick["impls"] = sorted(set(pick["impls"]), key=ORDER.index)
    return [{"system": system, "shape": shape, "atoms": atoms, "impl": impl, "steps": steps,
             "dtype": args.dtype, "threads": threads}
            for system, shape, atoms, impl in itertools.product(*pick.values())]


def without_missing_peers(configs: list[dict]) -> list[dict]:
    """`configs` less those of a peer that is not installed, with one line saying so."""
    if any(c["impl"] == "symmetrix" for c in configs) and (why := symmetrix_missing()):
        print(f"symmetrix: {why}; arm skipped", flush=True)
        return [c for c in configs if c["impl"] != "symmetrix"]
    return configs


def convert_models(configs: list[dict], work: Path, timeout: float, limit: int) -> None:
    """Give each symmetrix configuration its model converted by Symmetrix-XL's own converter
    (once per shape and dtype, in a child) and a JIT cache in `work` (so that its `setup_s`
    times the compile, unless SYMMETRIX_JIT_CACHE names one), or the conversion's failure."""
    done: dict[tuple, dict] = {}
    cache = os.environ.get("SYMMETRIX_JIT_CACHE") or str(work / "symmetrix-jit")
    for c in configs:
        if c["impl"] != "symmetrix":
            continue
        key = (c["shape"], c["dtype"])
        if key not in done:
            done[key] = run_child({"impl": "convert", "shape": c["shape"], "dtype": c["dtype"],
                                   "work": str(work)}, timeout, limit,
                                  module="cfmtrain.bench.md")
            print(f"symmetrix: converted {c['shape']} ({c['dtype']}): {done[key]['status']}",
                  flush=True)
        c.update(jit_cache=cache, convert=done[key])


def _rel(value: float | None, ref: float | None) -> float:
    if value is None or ref is None:
        return float("nan")
    return abs(value - ref) / abs(ref) if ref else float(value != ref)


def add_comparisons(rows: list[dict]) -> None:
    """Against mace-torch's row of the same system, shape and size: speedup (its median step
    over this one), peak memory ratio, and the relative differences of the first call's energy
    and of its forces (their norm and their projection on a fixed probe, relative to the
    norm)."""
    key = ("system", "shape", "target_atoms", "dtype")
    mace = {tuple(r[k] for k in key): r for r in rows
            if r["impl"] == "mace" and r.get("status") == "ok"}
    for r in rows:
        ref = mace.get(tuple(r[k] for k in key))
        good = r.get("status") == "ok" and ref is not None
        nan = float("nan")
        r["speedup_vs_mace"] = ref["median_step_s"] / r["median_step_s"] if good else nan
        r["rss_vs_mace"] = r["peak_rss_mb"] / ref["peak_rss_mb"] if good else nan
        r["energy_rel_diff_vs_mace"] = _rel(r.get("energy"), ref.get("energy")) if good else nan
        r["forces_rel_diff_vs_mace"] = max(
            _rel(r.get("forces_norm"), ref.get("forces_norm")),
            abs(r["forces_probe"] - ref["forces_probe"]) / ref["forces_norm"]) if good else nan


def add_paired(rows: list[dict], rounds: int, timeout: float, limit: int) -> None:
    """On each fused row with another arm's row of the same system, shape and size: its paired
    speed-up over each (PAIRED_VS columns) from a child running every such arm in one process,
    `rounds` alternating rounds of one MD step each; the rounds' count in `rounds`."""
    key = ("system", "shape", "target_atoms", "dtype")
    ok = [r for r in rows if r.get("status") == "ok"]
    for r in rows:
        r.update(dict.fromkeys([*PAIRED, *PAIRED_VS["symmetrix"]], float("nan")))
        others = [o for o in ok if o["impl"] != "fused"
                  and tuple(o[k] for k in key) == tuple(r[k] for k in key)]
        if not (rounds and r["impl"] == "fused" and r.get("status") == "ok" and others):
            continue
        config = {"system": r["system"], "shape": r["shape"], "atoms": r["target_atoms"],
                  "impl": "paired", "rounds": rounds, "dtype": r["dtype"],
                  "threads": r["threads"], "arms": [o["impl"] for o in others] + ["fused"]}
        for o in others:  # the converted model and its compiled plugin, where the arm has one
            config.update({k: o[k] for k in ("symmetrix_model", "jit_cache") if k in o})
        paired = run_child(config, timeout, limit, module="cfmtrain.bench.md")
        if paired.get("status") == "ok":
            for arm, columns in paired["ratios"].items():
                r.update({ours: columns[k] for ours, k in zip(PAIRED_VS[arm], RATIOS,
                                                              strict=True)})
            r["rounds"] = rounds
        else:
            print(f"paired rounds of {r['system']} {r['shape']} failed: {paired['status']}",
                  flush=True)


def run(args: argparse.Namespace) -> int:
    """Run every configuration of the preset, write the CSV and the figure."""
    from cfmtrain.plots.md import draw_md  # lazy: not in the children (matplotlib)

    output = Path(args.output or f"results/bench/md_{args.preset}.csv")
    figure = Path(args.figure or f"results/figures/fig_md_{args.preset}.png")
    limit = memory_limit(args.memory_limit_gb)
    with tempfile.TemporaryDirectory(prefix="cfmtrain-bench-md-") as work:
        todo = without_missing_peers(configs(args))
        convert_models(todo, Path(work), args.timeout, limit)
        rows = [measure(config, args.timeout, limit) for config in todo]
        add_comparisons(rows)
        rounds = PRESETS[args.preset]["rounds"] if args.rounds is None else args.rounds
        add_paired(rows, rounds, args.timeout, limit)
    table = report([{c: r.get(c) for c in COLUMNS} for r in rows], output,
                   "MD: fused kernels, mace-torch and peers (seconds per 1 fs step)")
    draw_md(table, figure, sorted(SHAPES), IMPLS)
    return 0


def measure(config: dict, timeout: float, limit: int) -> dict:
    """One configuration's row from its child (a symmetrix one whose conversion failed: that
    failure)."""
    conversion = config.pop("convert", None)
    if conversion is not None and conversion.get("status") != "ok":
        row = {**config, "status": conversion["status"]}
    else:
        if conversion is not None:
            config["symmetrix_model"] = conversion["symmetrix_model"]
        row = run_child(config, timeout, limit, module="cfmtrain.bench.md")
        if conversion is not None:
            row["convert_s"] = conversion["convert_s"]
    row["target_atoms"] = config["atoms"]
    row["atoms"] = row.get("atoms") if row.get("status") == "ok" else None
    print(json.dumps({k: row.get(k) for k in ("system", "shape", "impl", "atoms", "status",
                                              "median_step_s", "peak_rss_mb")}), flush=True)
    return row

if __name__ == "__main__":
    from cfmtrain.bench.md_worker import main

    sys.exit(main(json.loads(sys.argv[1])))
