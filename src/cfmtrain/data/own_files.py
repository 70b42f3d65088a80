"""One's own data (config `kind: files`): extxyz/xyz, ASE databases (.db) and ASE trajectories
(.traj), by suffix, converted into the pipeline's frames by `cfmtrain convert NAME --own-data`.

Labels are found as cfmtrain.data.own_keys describes; each frame keeps its own config_type
(frames without one get the data set's name), so the graph store's subsets are config_types.
Isolated-atom frames (config_type IsolatedAtom / isolated_atom) are never trained on; they give
the E0s when config `e0s` is `isolated` (cfmtrain.data.own_e0s).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ase import Atoms

from cfmtrain.data.extxyz import EmptyInputError, iter_extxyz, named_errors, unique_files
from cfmtrain.data.own_e0s import Located, check_covers, resolve_e0s, write_e0s
from cfmtrain.data.own_keys import FIELDS, LabelKeys, config_type_of, own_frame
from cfmtrain.data.validate import LIMITS, InvalidFrameError, Limits, Problem, RawFrame

FORMATS = {".extxyz": "extxyz", ".xyz": "extxyz", ".traj": "traj", ".db": "db"}
ISOLATED_TYPES = ("IsolatedAtom", "isolated_atom")


def own_format(path: Path) -> str:
    """The reader of a file, from its suffix: extxyz, traj or db."""
    try:
        return FORMATS[path.suffix.lower()]
    except KeyError:
        raise ValueError(f"{path}: unknown suffix {path.suffix!r} (own data: "
                         f"{', '.join(FORMATS)})") from None


def _db_atoms(path: Path) -> Iterator[tuple[str, Atoms]]:
    import ase.db

    with ase.db.connect(str(path)) as db:
        for row in db.select():
            atoms = row.toatoms()  # energy/forces/stress as calculator results
            atoms.info.update(row.key_value_pairs)
            atoms.info.update(row.get("data") or {})
            yield f"id={row.id}", atoms


def read_located(path: Path) -> Iterator[tuple[str, int | str, Atoms | None, Problem | None]]:
    """(file, frame, atoms, None) of every frame of one file, or (file, frame, None, problem)
    for an unreadable one; errors name the file and frame; a file without frames is an error."""
    import ase.io

    kind, source = own_format(path), str(path)
    if path.stat().st_size == 0:
        raise EmptyInputError(source)
    if kind == "extxyz":
        with open(path, encoding="utf-8") as fh:
            for index, atoms, problem in iter_extxyz(fh, source):
                yield source, index, atoms, problem
        return
    frames = (_db_atoms(path) if kind == "db"
              else enumerate(ase.io.iread(source, index=":", format=kind)))
    count = 0
    for index, atoms in named_errors(frames, source, lambda item: item[0]):
        count += 1
        yield source, index, atoms, None
    if count == 0:
        raise EmptyInputError(source, "no frames read")


def read_atoms(path: Path) -> Iterator[Located]:
    """(file, frame, atoms) of every frame of one file; an unreadable frame is an error."""
    for source, index, atoms, problem in read_located(path):
        if problem is not None:
            raise InvalidFrameError(source, index, *problem)
        yield source, index, atoms


@dataclass
class OwnReader:
    """Reads frames for training; sets the isolated-atom frames aside and notes the elements."""

    keys: LabelKeys
    isolated: list[Located] = field(default_factory=list)
    numbers: set[int] = field(default_factory=set)

    def frames(self, files: Sequence[Path]) -> Iterator[RawFrame]:
        """The frames to train on, file by file, in order."""
        from cfmtrain.data.convert import problem_frame

        for path in files:
            for source, index, atoms, problem in read_located(path):
                if problem is not None:
                    yield problem_frame(source, index, problem)
                    continue
                if config_type_of(atoms, self.keys) in ISOLATED_TYPES:
                    self.isolated.append((source, index, atoms))
                    continue
                self.numbers.update(int(z) for z in atoms.numbers)
                yield own_frame(atoms, source, index, self.keys)


def parse_keys(pairs: Sequence[str]) -> LabelKeys:
    """`FIELD=NAME` pairs (`FIELD=` ignores the field) over the defaults."""
    keys: dict[str, str | None] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--key {pair!r}: expected FIELD=NAME with FIELD one of "
                             f"{', '.join(FIELDS)}")
        keys[name] = value or None
    return LabelKeys.from_mapping(keys)


def convert_own(dataset: str, files: Sequence[str | os.PathLike], output_dir: str | os.PathLike,
                num_shards: int = 1, keys: LabelKeys | None = None, e0s: str = "fit",
                skip_invalid: bool = False, progress: bool = True,
                limits: Limits = LIMITS) -> dict:
    """Convert own files into frame shards, `e0s.json` (given E0s) and manifest.json (last);
    the previous outputs in `output_dir` are replaced only if the conversion succeeds."""
    from cfmtrain.data.convert import (
        MANIFEST,
        SHARD_NAME,
        limits_record,
        staged_outputs,
        write_shards,
    )
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
    paths, digests = unique_files(paths)
    # a bad mapping or file fails before any frame is read; `isolated` needs the frames first
    given = None if e0s == "isolated" else resolve_e0s(e0s, [], keys, read_atoms)
    reader = OwnReader(keys)
    with staged_outputs(output_dir) as staging:
        counts = write_shards(reader.frames(paths), staging, num_shards, dataset, skip_invalid,
                              progress, limits)
        given = given or resolve_e0s(e0s, reader.isolated, keys, read_atoms)
        check_covers(given, reader.numbers)
        write_e0s(staging, given)
        manifest = {
            "dataset": dataset, "kind": "files", "default_config_type": dataset,
            "sources": [{"path": str(p), "bytes": p.stat().st_size, "sha256": digests[p]}
                        for p in paths],
            "keys": keys.as_dict(), "e0s": given.record(),
            "isolated_atoms": len(reader.isolated), "limits": limits_record(limits),
            "num_shards": num_shards, "shards": [SHARD_NAME.format(k) for k in range(num_shards)],
            **counts,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


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


def run(args: argparse.Namespace) -> int:
    """`cfmtrain convert NAME --own-data ...`: convert, print a summary or a one-line error."""
    from cfmtrain.data.convert import limits_for

    try:
        manifest = convert_own(args.name, args.input, args.output, args.shards,
                               parse_keys(args.key), args.e0s, args.skip_invalid,
                               not args.no_progress, limits_for(args))
    except (InvalidFrameError, ValueError, FileNotFoundError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{args.name}: {manifest['frames']} frames in {args.shards} shard(s) under "
          f"{args.output}; {manifest['isolated_atoms']} isolated-atom frames; E0s "
          f"{manifest['e0s']['method']}; skipped {manifest['skipped']} "
          f"{manifest['skipped_by_reason']}")
    return 0
