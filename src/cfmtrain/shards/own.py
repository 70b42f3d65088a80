"""`cfmtrain convert NAME --own-data`: one's own files (cfmtrain.readers.own) into the
pipeline's frame shards, `e0s.json` and manifest (cfmtrain.shards.writer)."""

from __future__ import annotations

import argparse
import glob
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from cfmtrain.frames.keys import FIELDS, LabelKeys
from cfmtrain.frames.validate import LIMITS, InvalidFrameError, Limits
from cfmtrain.readers.e0s import TRAINING_METHODS, check_covers, resolve_e0s, write_e0s
from cfmtrain.readers.own import OwnReader, own_format, parse_keys, read_atoms
from cfmtrain.shards.parts import convert_parts, plan_parts
from cfmtrain.shards.sources import source_record
from cfmtrain.shards.writer import (
    manifest,
    shard_paths,
    staged_outputs,
    unique_files,
    write_manifest,
)


def convert_own(dataset: str, files: Sequence[str | os.PathLike], output_dir: str | os.PathLike,
                num_shards: int = 1, keys: LabelKeys | None = None, e0s: str = "fit",
                skip_invalid: bool = False, progress: bool = True,
                limits: Limits = LIMITS, workers: int = 1) -> dict:
    """Convert own files into frame shards, `e0s.json` (given E0s) and manifest.json (last),
    in `workers` processes (shards.parts: the same shards for any number); the previous
    outputs in `output_dir` are replaced only if the conversion succeeds."""
    keys = keys or LabelKeys.from_mapping()
    paths = [Path(f) for f in files]
    for path in paths:
        if path.is_dir():
            raise ValueError(f"{path}: is a folder; list its files or a glob such as "
                             f"'{path}/*.xyz' ('**' recurses)")
        if not path.is_file():
            raise FileNotFoundError(f"{path}: " + ("matches no file" if glob.has_magic(str(path))
                                                   else "no such file"))
        own_format(path)
    paths, records = unique_files(paths)
    # an E0s file is an input too: recorded (before it is read) as the manifest's e0s_file
    e0s_file = (source_record(e0s) if e0s not in (*TRAINING_METHODS, "isolated")
                and not e0s.lstrip().startswith("{") and Path(e0s).is_file() else None)
    # a bad mapping or file fails before any frame is read; `isolated` needs the frames first
    given = None if e0s == "isolated" else resolve_e0s(e0s, [], keys, read_atoms)
    parts = plan_parts(paths, workers, lambda p: own_format(p) == "extxyz")
    with staged_outputs(output_dir) as staging:
        counts, seen = convert_parts(OwnReader(keys), parts, staging,
                                     shard_paths(staging, num_shards), dataset, skip_invalid,
                                     progress, limits, workers)
        isolated = [frame for part in seen for frame in part["isolated"]]
        given = given or resolve_e0s(e0s, isolated, keys, read_atoms)
        check_covers(given, set().union(*(part["numbers"] for part in seen)))
        write_e0s(staging, given)
        record = manifest(
            {"dataset": dataset, "kind": "files", "default_config_type": dataset}, paths,
            records, {"keys": keys.as_dict(), "e0s": given.record(),
                      **({"e0s_file": e0s_file} if e0s_file else {}),
                      "isolated_atoms": len(isolated)}, limits, num_shards, counts)
        write_manifest(staging, record)
    return record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The own-data options of `cfmtrain convert`."""
    group = parser.add_argument_group("own data (config kind: files)")
    group.add_argument("--own-data", action="store_true",
                       help="read the --input files (.extxyz/.xyz/.db/.traj) as own data: labels "
                       "by --key or the defaults, each frame's config_type kept")
    group.add_argument("--key", action="append", default=[], metavar="FIELD=NAME",
                       help=f"where a label is ({', '.join(FIELDS)}); FIELD= ignores it")
    group.add_argument("--e0s", default="fit", help="fit, average, isolated (frames marked "
                       "config_type=IsolatedAtom), a JSON mapping element->eV, or a file of "
                       "isolated-atom frames")


def run(args: argparse.Namespace, limits: Limits) -> int:
    """`cfmtrain convert NAME --own-data ...`: convert, print a summary or a one-line error."""
    try:
        manifest = convert_own(args.name, args.input, args.output, args.shards,
                               parse_keys(args.key), args.e0s, args.skip_invalid,
                               not args.no_progress, limits, args.workers)
    except (InvalidFrameError, ValueError, FileNotFoundError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{args.name}: {manifest['frames']} frames in {args.shards} shard(s) under "
          f"{args.output}; {manifest['isolated_atoms']} isolated-atom frames; E0s "
          f"{manifest['e0s']['method']}; skipped {manifest['skipped']} "
          f"{manifest['skipped_by_reason']}")
    return 0
