"""`cfmtrain convert`: a data set's files into the pipeline's frame shards and manifest
(cfmtrain.shards.writer), by one body for every kind of data set and every input format.

The files are read by the reader their suffix names (cfmtrain.frames.formats); what differs by
kind (which inputs, how frames are labelled, what the manifest adds) is a DataKind: a registered
set's (shards.registered) or one's own (shards.own, `--own-data`). Frames are checked by
cfmtrain.frames.validate, the check every stage shares.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from cfmtrain.frames.formats import FORMATS, format_of
from cfmtrain.frames.keys import LabelKeys
from cfmtrain.frames.validate import LIMITS, InvalidFrameError, Limits
from cfmtrain.readers.options import STRESS_UNITS, ReadOptions
from cfmtrain.readers.own import parse_keys
from cfmtrain.readers.read import ranges
from cfmtrain.shards import own
from cfmtrain.shards.own import OwnData
from cfmtrain.shards.parts import PartReader, convert_parts, plan_parts
from cfmtrain.shards.registered import Registered, default_options
from cfmtrain.shards.writer import (
    manifest,
    shard_paths,
    staged_outputs,
    unique_files,
    write_manifest,
)


class DataKind(Protocol):
    """What a kind of data set brings to a conversion."""

    dataset: str
    config_type: str  # of the frames without their own

    def files(self, inputs: Sequence[str | os.PathLike]) -> list[Path]:
        """The input files of `inputs`, or an error naming the one that cannot be read."""

    def reader(self) -> PartReader:
        """The reader of the parts, made once the files are known."""

    def head(self) -> dict:
        """The manifest's first entries."""

    def finish(self, staging: Path, summaries: list[dict]) -> dict:
        """The manifest's entries of this kind, once every part is read (its files written
        into `staging`)."""

    def notes(self, manifest: dict) -> str:
        """What the command's summary line adds."""


def convert_files(kind: DataKind, inputs: Sequence[str | os.PathLike],
                  output_dir: str | os.PathLike, num_shards: int = 1,
                  skip_invalid: bool = False, progress: bool = True, limits: Limits = LIMITS,
                  workers: int = 1) -> dict:
    """Convert the files of `inputs` into shards plus manifest.json, in `workers` processes
    (shards.parts: the same shards for any number); returns the manifest.

    The previous outputs in `output_dir` are replaced only if the conversion succeeds."""
    paths = kind.files(inputs)
    for path in paths:
        format_of(path)  # an unknown suffix fails before any file is read
    files, records = unique_files(paths)
    reader = kind.reader()
    parts = plan_parts(files, workers, ranges)
    with staged_outputs(output_dir) as staging:
        counts, summaries = convert_parts(reader, parts, staging,
                                          shard_paths(staging, num_shards), kind.config_type,
                                          skip_invalid, progress, limits, workers)
        by_file = counts.pop("frames_by_file")
        for path in files:  # which frames came from which file (cfmtrain.graphs.duplicates)
            records[path]["frames"] = by_file.get(str(path), 0)
        record = manifest(kind.head(), files, records, kind.finish(staging, summaries), limits,
                          num_shards, counts)
        write_manifest(staging, record)
    return record


def convert(dataset: str, inputs: Sequence[str | os.PathLike], output_dir: str | os.PathLike,
            num_shards: int = 1, opts: ReadOptions | None = None, config_type: str | None = None,
            skip_invalid: bool = False, progress: bool = True,
            limits: Limits = LIMITS, workers: int = 1) -> dict:
    """Convert a registered data set's files or folders (`opts`: the registry's by default;
    every frame's config_type `config_type`, the data set's name by default)."""
    kind = Registered(dataset, opts or default_options(dataset), config_type or dataset)
    return convert_files(kind, inputs, output_dir, num_shards, skip_invalid, progress, limits,
                         workers)


def convert_own(dataset: str, files: Sequence[str | os.PathLike], output_dir: str | os.PathLike,
                num_shards: int = 1, keys: LabelKeys | None = None, e0s: str = "fit",
                skip_invalid: bool = False, progress: bool = True,
                limits: Limits = LIMITS, workers: int = 1) -> dict:
    """Convert own files (labels by `keys`, the defaults if None), writing `e0s.json` for
    given E0s."""
    kind = OwnData(dataset, keys or LabelKeys.from_mapping(), e0s)
    return convert_files(kind, files, output_dir, num_shards, skip_invalid, progress, limits,
                         workers)


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain convert`."""
    parser.add_argument("name", help="data set name (registry entry; sets the default keys)")
    parser.add_argument("--input", nargs="+", required=True,
                        help=f"input files or folders (by suffix: {', '.join(FORMATS)})")
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


def kind_for(args: argparse.Namespace) -> DataKind:
    """Own data with `--own-data`, else a registered data set."""
    if args.own_data:
        return OwnData(args.name, parse_keys(args.key), args.e0s)
    return Registered(args.name, options_for(args.name, args), args.config_type or args.name)


def run(args: argparse.Namespace) -> int:
    """Convert, print a summary; a bad frame or input is a one-line error and exit code 1."""
    try:
        kind = kind_for(args)
        manifest = convert_files(kind, args.input, args.output, args.shards, args.skip_invalid,
                                 not args.no_progress, limits_for(args), args.workers)
    except (InvalidFrameError, ValueError, FileNotFoundError, KeyError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{args.name}: {manifest['frames']} frames in {args.shards} shard(s) under "
          f"{args.output}{kind.notes(manifest)}; skipped {manifest['skipped']} "
          f"{manifest['skipped_by_reason']}")
    return 0
