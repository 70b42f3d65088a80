"""`cfmtrain convert`: a data set's files (extxyz, zip of extxyz, ASE db, MPtrj JSON) into the
pipeline's frame shards and manifest (cfmtrain.shards.writer). Frames are checked by
cfmtrain.frames.validate, the check every stage shares.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from cfmtrain.frames.validate import LIMITS, InvalidFrameError, Limits
from cfmtrain.readers.formats import RegistryReader, expand_inputs, reader_for
from cfmtrain.readers.options import STRESS_UNITS, ReadOptions
from cfmtrain.shards import own
from cfmtrain.shards.parts import convert_parts, plan_parts
from cfmtrain.shards.writer import (
    manifest,
    shard_paths,
    staged_outputs,
    unique_files,
    write_manifest,
)
from cfmtrain.sources.registry import DATASETS, SourceKeys


def convert(dataset: str, inputs: Sequence[str | os.PathLike], output_dir: str | os.PathLike,
            num_shards: int = 1, opts: ReadOptions | None = None, config_type: str | None = None,
            skip_invalid: bool = False, progress: bool = True,
            limits: Limits = LIMITS, workers: int = 1) -> dict:
    """Convert `inputs` (files or folders) into shards plus manifest.json, in `workers`
    processes (shards.parts: the same shards for any number); returns the manifest.

    The previous outputs in `output_dir` are replaced only if the conversion succeeds."""
    opts = opts or default_options(dataset)
    _ = opts.stress_factor  # fail early on an unknown unit
    files, records = unique_files(expand_inputs(inputs))
    parts = plan_parts(files, workers, lambda p: reader_for(p) == "extxyz")
    with staged_outputs(output_dir) as staging:
        counts, _ = convert_parts(RegistryReader(opts), parts, staging,
                                  shard_paths(staging, num_shards), config_type or dataset,
                                  skip_invalid, progress, limits, workers)
        record = manifest(
            {"dataset": dataset, "config_type": config_type or dataset}, files, records,
            {"read_options": {"energy_key": opts.energy_key, "forces_key": opts.forces_key,
                              "stress_key": opts.stress_key, "stress_unit": opts.stress_unit}},
            limits, num_shards, counts)
        write_manifest(staging, record)
    return record


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain convert`."""
    parser.add_argument("name", help="data set name (registry entry; sets the default keys)")
    parser.add_argument("--input", nargs="+", required=True, help="input files or folders")
    parser.add_argument("--output", type=Path, required=True, help="output folder")
    parser.add_argument("--shards", type=int, default=1, help="number of output shards")
    parser.add_argument("--skip-invalid", action="store_true",
                        help="skip invalid frames (counted in the manifest) instead of failing")
    parser.add_argument("--energy-key", help="energy key in the source (MPtrj: "
                        "uncorrected_total_energy or corrected_total_energy)")
    parser.add_argument("--forces-key", help="forces key in the source")
    parser.add_argument("--stress-key", help="stress key in the source ('none': ignore stress)")
    parser.add_argument("--stress-unit", choices=sorted(STRESS_UNITS), help="source stress unit")
    parser.add_argument("--config-type", help="config_type written to every frame (default NAME)")
    parser.add_argument("--max-energy-per-atom", type=float, default=LIMITS.max_energy_per_atom,
                        metavar="EV", help="refuse a frame whose |energy| / atoms exceeds this "
                        "(eV/atom; default %(default)g)")
    parser.add_argument("--max-force", type=float, default=LIMITS.max_force, metavar="EV_PER_A",
                        help="refuse a frame with a larger force component (eV/A; default "
                        "%(default)g)")
    parser.add_argument("--max-stress", type=float, default=LIMITS.max_stress, metavar="EV_PER_A3",
                        help="refuse a frame with a larger stress component (eV/A^3; default "
                        "%(default)g)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--workers", type=int, default=1, help="processes: a large extxyz "
                        "file is read in ranges of frames, other files one per process "
                        "(default 1; the shards are the same for any number)")
    own.add_arguments(parser)


def default_options(name: str) -> ReadOptions:
    """The registry's read options for data set `name` (MACE's REF_* keys if unregistered)."""
    keys = DATASETS[name].keys if name in DATASETS else SourceKeys()
    return ReadOptions(keys.energy, keys.forces, keys.stress, keys.stress_unit)


def options_for(name: str, args: argparse.Namespace) -> ReadOptions:
    """Read options: the registry's defaults for `name`, overridden by the command line."""
    base = default_options(name)
    stress_key = args.stress_key if args.stress_key is not None else base.stress_key
    return ReadOptions(
        energy_key=args.energy_key or base.energy_key,
        forces_key=args.forces_key or base.forces_key,
        stress_key=None if stress_key in (None, "none", "") else stress_key,
        stress_unit=args.stress_unit or base.stress_unit,
    )


def limits_for(args: argparse.Namespace) -> Limits:
    """The label limits of the command line (ValueError for a non-positive one)."""
    return Limits(args.max_energy_per_atom, args.max_force, args.max_stress)


def run(args: argparse.Namespace) -> int:
    """Convert, print a summary; a bad frame or input is a one-line error and exit code 1."""
    if args.own_data:
        return own.run(args, limits_for(args))
    try:
        opts = options_for(args.name, args)
        manifest = convert(args.name, args.input, args.output, args.shards, opts,
                           args.config_type, args.skip_invalid, not args.no_progress,
                           limits_for(args), args.workers)
    except (InvalidFrameError, ValueError, FileNotFoundError, KeyError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{args.name}: {manifest['frames']} frames in {args.shards} shard(s) under "
          f"{args.output}; skipped {manifest['skipped']} {manifest['skipped_by_reason']}")
    return 0
