"""Convert a data set (extxyz, zip of extxyz, ASE db, MPtrj JSON) into the pipeline's frames.

Output: `OUTPUT_DIR/frames_0000.extxyz ...` (round-robin shards, MACE keys) and `manifest.json`,
written last. Frames are checked by cfmtrain.data.validate, the check every stage shares. The new
outputs are written into a staging folder and replace the previous ones only when the whole
conversion succeeded: a failed re-convert leaves the previous good output as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ase import Atoms, units

from cfmtrain import crash
from cfmtrain.atomic import atomic_path
from cfmtrain.data import own_files
from cfmtrain.data.extxyz import EmptyInputError, iter_extxyz, named_errors, unique_files
from cfmtrain.data.validate import (
    LIMITS,
    InvalidFrameError,
    Limits,
    Problem,
    RawFrame,
    check_frame,
    format_problem,
    frame_labels,
    raw_from_atoms,
)

# Factor from the source's unit/sign convention to eV/A^3 in ASE's sign convention
# (positive = tensile; VASP reports compressive stress as positive, hence the minus).
STRESS_UNITS: dict[str, float] = {
    "eV/A^3": 1.0,
    "GPa": units.GPa,
    "kBar": 0.1 * units.GPa,
    "GPa-vasp": -units.GPa,
    "kBar-vasp": -0.1 * units.GPa,
}
EXTXYZ_SUFFIXES = (".extxyz", ".xyz")
SHARD_NAME = "frames_{:04d}.extxyz"
MANIFEST = "manifest.json"
OUTPUT_GLOBS = ("frames_*.extxyz", "e0s.json", MANIFEST)  # what a conversion writes


def build_atoms(frame: RawFrame, config_type: str) -> Atoms:
    """The checked frame as ase.Atoms with MACE's keys (REF_energy, REF_forces, REF_stress)."""
    energy, forces, stress = frame_labels(frame)
    atoms = Atoms(numbers=frame.numbers, positions=frame.positions, cell=frame.cell,
                  pbc=frame.pbc)
    atoms.info.update(frame.info)
    atoms.info["REF_energy"] = energy
    if stress is not None:
        atoms.info["REF_stress"] = stress
    atoms.info.setdefault("config_type", config_type)  # own data's frames keep their own
    atoms.arrays["REF_forces"] = forces
    for key, value in frame.arrays.items():
        atoms.arrays[key] = np.asarray(value)
    return atoms


# ---------------------------------------------------------------- readers


@dataclass(frozen=True)
class ReadOptions:
    """Which keys hold the labels in the source files, and the stress unit."""

    energy_key: str = "REF_energy"
    forces_key: str = "REF_forces"
    stress_key: str | None = "REF_stress"
    stress_unit: str = "eV/A^3"

    @property
    def stress_factor(self) -> float:
        try:
            return STRESS_UNITS[self.stress_unit]
        except KeyError:
            raise ValueError(f"unknown stress unit {self.stress_unit!r}; "
                             f"known: {', '.join(STRESS_UNITS)}") from None


def problem_frame(source: str, index: int | str, problem: Problem) -> RawFrame:
    """A frame that could not be read: it carries the reader's problem and no atoms."""
    return RawFrame(source, index, np.zeros(0, int), np.zeros((0, 3)), np.zeros((3, 3)),
                    np.zeros(3, bool), problem=problem)


def _wrap_extxyz(lines: Iterable[str], source: str, opts: ReadOptions) -> Iterator[RawFrame]:
    for index, atoms, problem in iter_extxyz(lines, source):
        if problem is not None:
            yield problem_frame(source, index, problem)
        else:
            yield raw_from_atoms(atoms, source, index, opts.energy_key, opts.forces_key,
                                 opts.stress_key, opts.stress_factor)


def read_extxyz(path: Path, opts: ReadOptions) -> Iterator[RawFrame]:
    """Stream the frames of one extxyz file (cfmtrain.data.extxyz.iter_extxyz: a bad frame
    names the file, frame and line; an empty file is an error)."""
    with open(path, encoding="utf-8") as fh:
        yield from _wrap_extxyz(fh, str(path), opts)


def read_extxyz_zip(path: Path, opts: ReadOptions) -> Iterator[RawFrame]:
    """Stream the frames of every extxyz member of a zip archive (nothing extracted to disk)."""
    with zipfile.ZipFile(path) as archive:
        members = sorted(n for n in archive.namelist() if n.endswith(EXTXYZ_SUFFIXES))
        if not members:
            raise EmptyInputError(str(path), f"no {'/'.join(EXTXYZ_SUFFIXES)} member")
        for member in members:
            with archive.open(member) as raw:
                text = io.TextIOWrapper(raw, encoding="utf-8")
                yield from _wrap_extxyz(text, f"{path}:{member}", opts)


def read_ase_db(path: Path, opts: ReadOptions) -> Iterator[RawFrame]:
    """Stream the rows of an ASE database; key-value pairs and data are searched for labels."""
    import ase.db

    rows = 0
    with ase.db.connect(str(path)) as db:
        for row in db.select():
            rows += 1
            atoms = row.toatoms()
            atoms.info.update(row.key_value_pairs)
            for key, value in (row.get("data") or {}).items():
                if key == opts.forces_key and np.shape(value) == (len(atoms), 3):
                    atoms.arrays[key] = np.asarray(value, dtype=float)
                else:
                    atoms.info[key] = value
            yield raw_from_atoms(atoms, str(path), f"id={row.id}", opts.energy_key,
                                 opts.forces_key, opts.stress_key, opts.stress_factor)
    if rows == 0:
        raise EmptyInputError(str(path), "a database without rows")


def reader_for(path: Path) -> str:
    """The reader a file needs, from its name: mptrj, zip, db or extxyz."""
    name = path.name.lower()
    if name.endswith((".json", ".json.gz")):
        return "mptrj"
    if name.endswith(".zip"):
        return "zip"
    if name.endswith(".db"):
        return "db"
    if name.endswith(EXTXYZ_SUFFIXES):
        return "extxyz"
    raise ValueError(f"{path}: unknown input format (expected .extxyz, .xyz, .zip, .db, "
                     f".json or .json.gz)")


def expand_inputs(inputs: Sequence[str | os.PathLike]) -> list[Path]:
    """Files as given, folders replaced by their supported files (sorted); errors if none."""
    files: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            found = sorted(p for p in item.rglob("*") if p.is_file() and _supported(p))
            if not found:
                raise FileNotFoundError(f"{item}: no .extxyz/.xyz/.zip/.db/.json files found")
            files.extend(found)
        elif item.is_file():
            files.append(item)
        else:
            raise FileNotFoundError(f"{item}: no such file or folder")
    return files


def _supported(path: Path) -> bool:
    try:
        reader_for(path)
    except ValueError:
        return False
    return not path.name.endswith((".part", ".corrupt"))


def read_frames(files: Sequence[Path], opts: ReadOptions) -> Iterator[RawFrame]:
    """Every frame of every file, in order, each with its source file and index."""
    from cfmtrain.data.mptrj import read_mptrj

    readers = {"extxyz": read_extxyz, "zip": read_extxyz_zip, "db": read_ase_db,
               "mptrj": read_mptrj}
    for path in files:
        if path.stat().st_size == 0:
            raise EmptyInputError(str(path))
        yield from named_errors(readers[reader_for(path)](path, opts), str(path),
                                lambda frame: frame.index)



# ---------------------------------------------------------------- writer


class Staging:
    """A conversion's new outputs, written into a hidden folder inside `output_dir` and moved
    over the previous ones by `commit` (the old manifest first goes, the new one comes last);
    outputs of the previous conversion that this one did not write (frames_*.extxyz beyond the
    new shard count, e0s.json) are then removed."""

    def __init__(self, output_dir: str | os.PathLike) -> None:
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.output_dir.glob(".staging-*"):  # of a conversion killed outright
            if not _alive(stale.name.removeprefix(".staging-")):
                shutil.rmtree(stale, ignore_errors=True)
        self.folder = self.output_dir / f".staging-{os.getpid()}"
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir()
        crash.leftover(self.folder)

    def commit(self) -> None:
        """Put the staged outputs in place of the previous conversion's."""
        new = sorted(p.name for p in self.folder.iterdir())
        (self.output_dir / MANIFEST).unlink(missing_ok=True)
        for name in sorted(new, key=lambda n: n == MANIFEST):  # the manifest last
            os.replace(self.folder / name, self.output_dir / name)
        for pattern in OUTPUT_GLOBS:
            for old in self.output_dir.glob(pattern):
                if old.name not in new:
                    old.unlink()
        self.folder.rmdir()

    def discard(self) -> None:
        """Drop the staged outputs (the previous ones stay)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def _alive(pid: str) -> bool:
    """True if process `pid` (text) exists on this machine."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def staged_outputs(output_dir: str | os.PathLike) -> Iterator[Path]:
    """Yield a staging folder; its files replace the conversion outputs in `output_dir` only if
    the block succeeds, else they are dropped and the previous outputs stay as they were."""
    staging = Staging(output_dir)
    try:
        yield staging.folder
    except BaseException:
        staging.discard()
        raise
    staging.commit()


def write_shards(frames: Iterable[RawFrame], output_dir: str | os.PathLike, num_shards: int,
                 config_type: str, skip_invalid: bool = False,
                 progress: bool = True, limits: Limits = LIMITS) -> dict:
    """Check each frame and write the valid ones round-robin into `num_shards` extxyz files.

    Returns the counts for the manifest. An invalid frame raises InvalidFrameError (no shard is
    left behind) unless `skip_invalid`, which skips it and counts it per reason. Fewer valid
    frames than shards is an error: an empty shard would give an empty graph shard.
    `output_dir` is written as it is (convert passes a staging folder).
    """
    import ase.io
    from tqdm import tqdm

    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    per_shard = [0] * num_shards
    skipped: Counter[str] = Counter()
    examples: list[str] = []
    with contextlib.ExitStack() as stack:
        handles = []
        for k in range(num_shards):
            tmp = stack.enter_context(atomic_path(output_dir / SHARD_NAME.format(k)))
            handles.append(stack.enter_context(open(tmp, "w", encoding="utf-8")))
        bar = stack.enter_context(tqdm(unit=" frames", disable=not progress, desc=config_type))
        k = 0
        for frame in frames:
            bar.update(1)
            crash.at("checking frames", frame.source, frame.index)
            problem = check_frame(frame, limits=limits)
            if problem is not None:
                if not skip_invalid:
                    raise InvalidFrameError(frame.source, frame.index, *problem)
                skipped[problem[0]] += 1
                if len(examples) < 20:
                    examples.append(format_problem(frame.source, frame.index, *problem))
                continue
            ase.io.write(handles[k], build_atoms(frame, config_type), format="extxyz")
            per_shard[k] += 1
            k = (k + 1) % num_shards
        if sum(per_shard) < num_shards:
            raise ValueError(f"{sum(per_shard)} valid frame(s) for {num_shards} shards "
                             f"({sum(skipped.values())} skipped: {dict(skipped)}): every shard "
                             "needs a frame; use fewer shards")
    return {"frames": sum(per_shard), "frames_per_shard": per_shard,
            "skipped": sum(skipped.values()), "skipped_by_reason": dict(sorted(skipped.items())),
            "skipped_examples": examples}


def convert(dataset: str, inputs: Sequence[str | os.PathLike], output_dir: str | os.PathLike,
            num_shards: int = 1, opts: ReadOptions | None = None, config_type: str | None = None,
            skip_invalid: bool = False, progress: bool = True,
            limits: Limits = LIMITS) -> dict:
    """Convert `inputs` (files or folders) into shards plus manifest.json; returns the manifest.

    The previous outputs in `output_dir` are replaced only if the conversion succeeds."""
    opts = opts or default_options(dataset)
    _ = opts.stress_factor  # fail early on an unknown unit
    files, digests = unique_files(expand_inputs(inputs))
    with staged_outputs(output_dir) as staging:
        counts = write_shards(read_frames(files, opts), staging, num_shards,
                              config_type or dataset, skip_invalid, progress, limits)
        manifest = {
            "dataset": dataset,
            "config_type": config_type or dataset,
            "sources": [{"path": str(p), "bytes": p.stat().st_size, "sha256": digests[p]}
                        for p in files],
            "read_options": {"energy_key": opts.energy_key, "forces_key": opts.forces_key,
                             "stress_key": opts.stress_key, "stress_unit": opts.stress_unit},
            "limits": limits_record(limits),
            "num_shards": num_shards,
            "shards": [SHARD_NAME.format(k) for k in range(num_shards)],
            **counts,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def limits_record(limits: Limits) -> dict[str, float]:
    """The label limits, for manifests."""
    return {"max_energy_per_atom": limits.max_energy_per_atom, "max_force": limits.max_force,
            "max_stress": limits.max_stress}


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
    own_files.add_arguments(parser)


def default_options(name: str) -> ReadOptions:
    """The registry's read options for data set `name` (MACE's REF_* keys if unregistered)."""
    from cfmtrain.data.registry import DATASETS, SourceKeys

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
        return own_files.run(args)
    try:
        opts = options_for(args.name, args)
        manifest = convert(args.name, args.input, args.output, args.shards, opts,
                           args.config_type, args.skip_invalid, not args.no_progress,
                           limits_for(args))
    except (InvalidFrameError, ValueError, FileNotFoundError, KeyError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{args.name}: {manifest['frames']} frames in {args.shards} shard(s) under "
          f"{args.output}; skipped {manifest['skipped']} {manifest['skipped_by_reason']}")
    return 0
