"""`cfmtrain sweep batch|capacity|calibrate`: the batch-size sweep of Figure 11, the bin-capacity
sweep of section 5.5 and the simulator's calibration (the cells' model, --set as `cfmtrain
train`), each series timed in its own subprocess; CSV (and the recommendation) out."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cfmtrain.atomic import atomic_path
from cfmtrain.graphs.split import load_split
from cfmtrain.graphs.store import GraphStore
from cfmtrain.settings import add_settings, from_args, given
from cfmtrain.sweep import batch, calibrate, capacity
from cfmtrain.sweep.settings import Preset, SweepSettings
from cfmtrain.tables import write_table
from cfmtrain.train.build import load_parts
from cfmtrain.train.config import load_config

# quick: a reduced model and few points (about 2 minutes on 2 cores); full: the paper's model.
# The calibration times the cells' own model (--set) at `calibration` atoms per batch, `repeats`
# steps a point at least (more for small batches, see sweep.calibrate; quick: 2 pools x 6 sizes
# x 2 compute paths, about 3 minutes on 2 cores with the cells' 32x0e+32x1o, lmax 2 model).
SMALL_MODEL = ["model.hidden_irreps=16x0e+16x1o", "model.max_ell=2", "model.correlation=2",
               "model.radial_mlp=[16,16]"]
PRESETS: dict[Preset, dict] = {
    "quick": {"overrides": SMALL_MODEL, "small": [1, 4, 16], "large": [1, 2],
              "capacities": [256, 512, 1024], "repeats": 2,
              "calibration": [96, 256, 512, 1024, 2048, 3072], "calibration_repeats": 3},
    "full": {"overrides": [], "small": [1, 2, 4, 8, 16, 32, 64], "large": [1, 2, 4, 8, 16],
             "capacities": [512, 800, 1024, 1536, 2048, 3072, 4096, 6144], "repeats": 3,
             "calibration": [64, 128, 256, 512, 800, 1024, 1536, 2048, 3072, 4096],
             "calibration_repeats": 5},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain sweep`."""
    parser.add_argument("kind", choices=["batch", "capacity", "calibrate"])
    parser.add_argument("--graphs", type=Path, nargs="+", required=True,
                        help="graph store folder (calibrate: several, a union, as train)")
    parser.add_argument("--split", type=Path, required=True, help="the store's split.npz")
    parser.add_argument("--override", action="append", default=[],
                        help="training-config KEY=VALUE on top of the preset's model")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="calibrate: the cells' training setting (as `cfmtrain train --set`)")
    parser.add_argument("--output", type=Path, required=True, help="CSV to write")
    parser.add_argument("--recommendation", type=Path,
                        help="capacity: JSON with the recommended capacity (Markdown beside)")
    add_settings(parser, SweepSettings)


def run(args: argparse.Namespace) -> int:
    """Run the sweep and write its CSV (and the capacity recommendation)."""
    s = from_args(SweepSettings, args)
    preset = PRESETS[s.preset]
    if len(args.graphs) > 1 and args.kind != "calibrate":
        raise SystemExit(f"sweep {args.kind}: one graph store folder, got {len(args.graphs)}")
    store = GraphStore(args.graphs if len(args.graphs) > 1 else args.graphs[0])
    if args.kind == "calibrate":
        if args.override or "dtypes" in given(args):
            raise SystemExit("sweep calibrate: the model and dtype are the cells' (--set), not "
                             "--override/--dtypes")
        return _calibrate(args, s, store, preset)
    overrides = [*preset["overrides"], *args.override]
    common = dict(overrides=overrides, repeats=preset["repeats"],
                  budget_mb=s.memory_budget_mb, threads=s.threads)
    if args.kind == "batch":
        frame = write_table(args.output, batch.batch_sweep(
            store, str(args.split), {"small": s.small_subset, "large": s.large_subset},
            {"small": preset["small"], "large": preset["large"]}, s.dtypes, **common),
            batch.BatchPoint)
    else:
        train = load_split(args.split)["train"]
        frame = write_table(args.output, capacity.capacity_sweep(
            store, str(args.split), train, preset["capacities"], s.dtypes, **common),
            capacity.CapacityPoint)
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.kind == "capacity" and args.recommendation:
        largest = int(store.num_atoms.max())
        recs = [capacity.recommend(frame, largest, d, s.tolerance) for d in s.dtypes]
        main = recs[0]
        data = {**main, "per_dtype": recs, "preset": s.preset, "graphs": str(args.graphs[0])}
        with atomic_path(args.recommendation) as tmp:
            tmp.write_text(json.dumps(data, indent=2) + "\n")
        with atomic_path(args.recommendation.with_suffix(".md")) as tmp:
            tmp.write_text(_markdown(recs, s.preset, args.graphs[0]))
        print(_markdown(recs, s.preset, args.graphs[0]))
    return 0


def _calibrate(args: argparse.Namespace, s: SweepSettings, store, preset: dict) -> int:
    """The calibration with the cells' settings; threads from them, else the sweep's."""
    cfg = load_config(overrides=args.settings)  # a wrong key or value fails here, named
    train = load_parts(store, args.split, cfg)["train"]  # the cells' training graphs
    points = calibrate.calibration_sweep(store, str(args.split), train, preset["calibration"],
                                         args.settings, preset["calibration_repeats"],
                                         cfg.threads or s.threads)
    frame = write_table(args.output, points, calibrate.CalibrationPoint)
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


def _markdown(recs: list[dict], preset: str, graphs: Path) -> str:
    lines = [f"# Recommended bin capacity ({preset} preset, {graphs})", "",
             "| dtype | recommended (atoms) | lower bound: largest graph | memory upper bound |"
             " reason |", "|---|---:|---:|---:|---|"]
    for r in recs:
        lines.append(f"| {r['dtype']} | {r['recommended_capacity']} | {r['lower_bound']} | "
                     f"{r['memory_upper_bound'] or 'none hit'} | {r['reason']} |")
    return "\n".join(lines) + ("\n\nThe paper (section 5.5, A100 80 GB): compute saturates at 800 "
                               "(float32) / 400 (float64) atoms, memory ends near 4,000 / 2,000; "
                               "it trains with 3,072.\n")
