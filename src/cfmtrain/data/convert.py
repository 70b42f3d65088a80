"""Convert a data set (extxyz, zip of extxyz, ASE db, MPtrj JSON) into the pipeline's frames.

Output: `OUTPUT_DIR/frames_0000.extxyz ...` (round-robin shards, MACE keys) and `manifest.json`,
written last. `validate_atoms` is the one check of a frame that every stage shares.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from ase import Atoms, units

from cfmtrain.atomic import atomic_path

# Factor from the source's unit/sign convention to eV/A^3 in ASE's sign convention
# (positive = tensile; VASP reports compressive stress as positive, hence the minus).
STRESS_UNITS: dict[str, float] = {
    "eV/A^3": 1.0,
    "GPa": units.GPa,
    "kBar": 0.1 * units.GPa,
    "GPa-vasp": -units.GPa,
    "kBar-vasp": -0.1 * units.GPa,
}
MIN_DISTANCE = 0.1  # Angstrom: closer atoms are an error
# The overlap search runs vesin at this radius and keeps pairs below MIN_DISTANCE: vesin bins space
# by its cutoff, and 0.1 A bins make it ~20-1000x slower (88 ms vs 4 ms for 768 atoms of water).
OVERLAP_SEARCH_RADIUS = 2.0
MIN_ABS_DET = 1e-6  # Angstrom^3: smaller |det(cell)| with any periodic direction is singular
EXTXYZ_SUFFIXES = (".extxyz", ".xyz")
SHARD_NAME = "frames_{:04d}.extxyz"
MANIFEST = "manifest.json"


class InvalidFrameError(ValueError):
    """A frame that cannot be used; the message names the file, the frame and the reason."""

    def __init__(self, source: str, index: int | str, reason: str, detail: str) -> None:
        self.source, self.index, self.reason, self.detail = source, index, reason, detail
        super().__init__(format_problem(source, index, reason, detail))


def format_problem(source: str, index: int | str, reason: str, detail: str) -> str:
    """`file: frame i: reason (detail)`."""
    return f"{source}: frame {index}: {reason}" + (f" ({detail})" if detail else "")


@dataclass
class RawFrame:
    """A frame as read from a source, labels not yet checked or converted."""

    source: str
    index: int | str
    numbers: np.ndarray
    positions: np.ndarray
    cell: np.ndarray
    pbc: np.ndarray
    energy: object = None
    forces: object = None
    stress: object = None
    stress_factor: float = 1.0
    info: dict = field(default_factory=dict)
    arrays: dict = field(default_factory=dict)
    problem: tuple[str, str] | None = None  # set by a reader for malformed records


# ---------------------------------------------------------------- validation


def read_label(atoms: Atoms, key: str | None, per_atom: bool = False) -> object:
    """`key` from atoms.arrays / atoms.info, else from the attached calculator's results."""
    if key is None:
        return None
    if per_atom and key in atoms.arrays:
        return atoms.arrays[key]
    if key in atoms.info:
        return atoms.info[key]
    results = getattr(atoms.calc, "results", None) or {}
    return results.get(key)


def raw_from_atoms(atoms: Atoms, source: str, index: int | str, energy_key: str = "REF_energy",
                   forces_key: str = "REF_forces", stress_key: str | None = "REF_stress",
                   stress_factor: float = 1.0) -> RawFrame:
    """Wrap an ase.Atoms and its labels (under the given keys) as a RawFrame."""
    labels = {energy_key, forces_key, stress_key, "config_type"}
    info = {k: v for k, v in atoms.info.items()
            if k not in labels and isinstance(v, (str, int, float, np.integer, np.floating))}
    if "config_type" in atoms.info:
        info["source_config_type"] = atoms.info["config_type"]
    return RawFrame(
        source=source, index=index, numbers=atoms.numbers, positions=atoms.positions,
        cell=atoms.cell.array, pbc=atoms.pbc, energy=read_label(atoms, energy_key),
        forces=read_label(atoms, forces_key, per_atom=True),
        stress=read_label(atoms, stress_key), stress_factor=stress_factor, info=info,
    )


def _stress_3x3(stress: object) -> np.ndarray | None:
    from ase.stress import voigt_6_to_full_3x3_stress

    s = np.asarray(stress, dtype=float)
    if s.shape == (6,):
        return voigt_6_to_full_3x3_stress(s)
    if s.shape in ((9,), (3, 3)):
        return s.reshape(3, 3)
    return None


def _labels(frame: RawFrame) -> tuple[float, np.ndarray, np.ndarray | None]:
    """Energy, forces and stress (converted) as floats; raises (reason, detail) on failure."""
    n = len(frame.numbers)
    if frame.energy is None:
        raise _Problem("missing energy", "")
    try:
        energy = float(np.asarray(frame.energy, dtype=float).reshape(()))
    except (TypeError, ValueError) as err:
        raise _Problem("bad energy", str(err)) from None
    if frame.forces is None:
        raise _Problem("missing forces", "")
    try:
        forces = np.asarray(frame.forces, dtype=float)
    except (TypeError, ValueError) as err:
        raise _Problem("bad forces", str(err)) from None
    if forces.shape != (n, 3):
        raise _Problem("bad forces", f"shape {forces.shape}, expected ({n}, 3)")
    stress = None
    if frame.stress is not None:
        try:
            stress = _stress_3x3(frame.stress)
        except (TypeError, ValueError) as err:
            raise _Problem("bad stress", str(err)) from None
        if stress is None:
            raise _Problem("bad stress", f"shape {np.shape(frame.stress)}, expected 3x3 or 6")
        stress = stress * frame.stress_factor
    return energy, forces, stress


class _Problem(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


def check_frame(frame: RawFrame, check_overlap: bool = True) -> tuple[str, str] | None:
    """(reason, detail) of the first problem of a frame, or None if it is usable."""
    if frame.problem is not None:
        return frame.problem
    try:
        _check_structure(frame)
        energy, forces, stress = _labels(frame)
        if not np.isfinite(energy):
            raise _Problem("non-finite energy", f"energy = {energy}")
        if not np.isfinite(forces).all():
            raise _Problem("non-finite forces", f"{int((~np.isfinite(forces)).sum())} values")
        if stress is not None and not np.isfinite(stress).all():
            raise _Problem("non-finite stress", "")
        if check_overlap:
            _check_overlap(frame)
    except _Problem as p:
        return p.reason, p.detail
    return None


def _check_structure(frame: RawFrame) -> None:
    numbers = np.asarray(frame.numbers)
    if len(numbers) == 0:
        raise _Problem("empty frame", "no atoms")
    bad = (numbers < 1) | (numbers > 118)
    if bad.any():
        raise _Problem("unknown element", f"atomic number {int(numbers[bad][0])} at atom "
                       f"{int(np.flatnonzero(bad)[0])}")
    if not np.isfinite(frame.positions).all():
        raise _Problem("non-finite positions", "")
    cell = np.asarray(frame.cell, dtype=float)
    if not np.isfinite(cell).all():
        raise _Problem("non-finite cell", "")
    if np.any(frame.pbc) and abs(np.linalg.det(cell)) < MIN_ABS_DET:
        raise _Problem("singular cell with periodic boundaries",
                       f"|det(cell)| = {abs(np.linalg.det(cell)):.3g} A^3, pbc = "
                       f"{[bool(p) for p in frame.pbc]}")


def _check_overlap(frame: RawFrame) -> None:
    """Atoms (or an atom and a periodic image) closer than MIN_DISTANCE."""
    from vesin import NeighborList

    if len(frame.numbers) < 2 and not np.any(frame.pbc):
        return
    nl = NeighborList(cutoff=OVERLAP_SEARCH_RADIUS, full_list=False)
    i, j, d = nl.compute(np.asarray(frame.positions, dtype=float),
                         np.asarray(frame.cell, dtype=float),
                         [bool(p) for p in frame.pbc], "ijd")
    close = d < MIN_DISTANCE
    if close.any():
        i, j, d = i[close], j[close], d[close]
        k = int(np.argmin(d))
        raise _Problem("overlapping atoms", f"atoms {int(i[k])} and {int(j[k])} are "
                       f"{d[k]:.4f} A apart, minimum {MIN_DISTANCE} A")


def atoms_problem(atoms: Atoms, source: str | os.PathLike, index: int | str,
                  keys: dict[str, str | None] | None = None,
                  check_overlap: bool = True) -> tuple[str, str] | None:
    """(reason, detail) of the first problem of a labelled frame, or None. Pure.

    `keys` maps "energy"/"forces"/"stress" to the frame's key names (default MACE's REF_*).
    """
    keys = {"energy": "REF_energy", "forces": "REF_forces", "stress": "REF_stress",
            **(keys or {})}
    frame = raw_from_atoms(atoms, str(source), index, keys["energy"], keys["forces"],
                           keys["stress"])
    return check_frame(frame, check_overlap)


def frame_message(atoms: Atoms, source: str | os.PathLike, index: int | str,
                  keys: dict[str, str | None] | None = None,
                  check_overlap: bool = True) -> str | None:
    """None if the frame is usable, else `file: frame i: reason (detail)`. Pure."""
    problem = atoms_problem(atoms, source, index, keys, check_overlap)
    return None if problem is None else format_problem(str(source), index, *problem)


def validate_atoms(atoms: Atoms, source: str | os.PathLike, index: int | str,
                   keys: dict[str, str | None] | None = None,
                   check_overlap: bool = True) -> None:
    """Return None for a usable frame; raise InvalidFrameError (file, frame, reason) otherwise.

    Checks: empty frame, unknown element (Z outside 1..118, e.g. 'X'), NaN/inf in positions,
    cell, energy, forces or stress, missing energy or forces, a singular cell with periodic
    boundaries, atoms (or periodic images) closer than 0.1 A. `keys` maps "energy"/"forces"/
    "stress" to key names (default REF_*). A caller that builds its own neighbour list may pass
    `check_overlap=False` and test its edge lengths against MIN_DISTANCE. No side effects; use
    `frame_message` for the message as a string instead of an exception.
    """
    problem = atoms_problem(atoms, source, index, keys, check_overlap)
    if problem is not None:
        raise InvalidFrameError(str(source), index, *problem)


def build_atoms(frame: RawFrame, config_type: str) -> Atoms:
    """The checked frame as ase.Atoms with MACE's keys (REF_energy, REF_forces, REF_stress)."""
    energy, forces, stress = _labels(frame)
    atoms = Atoms(numbers=frame.numbers, positions=frame.positions, cell=frame.cell,
                  pbc=frame.pbc)
    atoms.info.update(frame.info)
    atoms.info["REF_energy"] = energy
    if stress is not None:
        atoms.info["REF_stress"] = stress
    atoms.info["config_type"] = config_type
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


def _wrap(atoms_iter: Iterable[Atoms], source: str, opts: ReadOptions) -> Iterator[RawFrame]:
    for index, atoms in enumerate(atoms_iter):
        yield raw_from_atoms(atoms, source, index, opts.energy_key, opts.forces_key,
                             opts.stress_key, opts.stress_factor)


def read_extxyz(path: Path, opts: ReadOptions) -> Iterator[RawFrame]:
    """Stream the frames of one extxyz file."""
    import ase.io

    yield from _wrap(ase.io.iread(str(path), index=":", format="extxyz"), str(path), opts)


def read_extxyz_zip(path: Path, opts: ReadOptions) -> Iterator[RawFrame]:
    """Stream the frames of every extxyz member of a zip archive (nothing extracted to disk)."""
    import ase.io

    with zipfile.ZipFile(path) as archive:
        members = sorted(n for n in archive.namelist() if n.endswith(EXTXYZ_SUFFIXES))
        for member in members:
            with archive.open(member) as raw:
                text = io.TextIOWrapper(raw, encoding="utf-8")
                frames = ase.io.iread(text, index=":", format="extxyz")
                yield from _wrap(frames, f"{path}:{member}", opts)


def read_ase_db(path: Path, opts: ReadOptions) -> Iterator[RawFrame]:
    """Stream the rows of an ASE database; key-value pairs and data are searched for labels."""
    import ase.db

    with ase.db.connect(str(path)) as db:
        for row in db.select():
            atoms = row.toatoms()
            atoms.info.update(row.key_value_pairs)
            for key, value in (row.get("data") or {}).items():
                if key == opts.forces_key and np.shape(value) == (len(atoms), 3):
                    atoms.arrays[key] = np.asarray(value, dtype=float)
                else:
                    atoms.info[key] = value
            yield raw_from_atoms(atoms, str(path), f"id={row.id}", opts.energy_key,
                                 opts.forces_key, opts.stress_key, opts.stress_factor)


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
        yield from readers[reader_for(path)](path, opts)


# ---------------------------------------------------------------- writer


def _clear_outputs(output_dir: Path) -> None:
    """Remove a previous conversion's manifest and shards so a failure leaves nothing stale."""
    (output_dir / MANIFEST).unlink(missing_ok=True)
    for old in output_dir.glob("frames_*.extxyz"):
        old.unlink()


def write_shards(frames: Iterable[RawFrame], output_dir: str | os.PathLike, num_shards: int,
                 config_type: str, skip_invalid: bool = False,
                 progress: bool = True) -> dict:
    """Check each frame and write the valid ones round-robin into `num_shards` extxyz files.

    Returns the counts for the manifest. An invalid frame raises InvalidFrameError (no shard is
    left behind) unless `skip_invalid`, which skips it and counts it per reason.
    """
    import ase.io
    from tqdm import tqdm

    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    _clear_outputs(output_dir)
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
            problem = check_frame(frame)
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
        if sum(per_shard) == 0:
            raise ValueError(f"no valid frames to write into {output_dir} "
                             f"({sum(skipped.values())} skipped: {dict(skipped)})")
    return {"frames": sum(per_shard), "frames_per_shard": per_shard,
            "skipped": sum(skipped.values()), "skipped_by_reason": dict(sorted(skipped.items())),
            "skipped_examples": examples}


def convert(dataset: str, inputs: Sequence[str | os.PathLike], output_dir: str | os.PathLike,
            num_shards: int = 1, opts: ReadOptions | None = None, config_type: str | None = None,
            skip_invalid: bool = False, progress: bool = True) -> dict:
    """Convert `inputs` (files or folders) into shards plus manifest.json; returns the manifest."""
    from cfmtrain.data.download import file_digest

    opts = opts or default_options(dataset)
    _ = opts.stress_factor  # fail early on an unknown unit
    files = expand_inputs(inputs)
    counts = write_shards(read_frames(files, opts), output_dir, num_shards,
                          config_type or dataset, skip_invalid, progress)
    manifest = {
        "dataset": dataset,
        "config_type": config_type or dataset,
        "sources": [{"path": str(p), "bytes": p.stat().st_size, "sha256": file_digest(p)}
                    for p in files],
        "read_options": {"energy_key": opts.energy_key, "forces_key": opts.forces_key,
                         "stress_key": opts.stress_key, "stress_unit": opts.stress_unit},
        "num_shards": num_shards,
        "shards": [SHARD_NAME.format(k) for k in range(num_shards)],
        **counts,
    }
    with atomic_path(Path(output_dir) / MANIFEST) as tmp:
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


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
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


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


def run(args: argparse.Namespace) -> int:
    """Convert, print a summary; a bad frame or input is a one-line error and exit code 1."""
    try:
        opts = options_for(args.name, args)
        manifest = convert(args.name, args.input, args.output, args.shards, opts,
                           args.config_type, args.skip_invalid, not args.no_progress)
    except (InvalidFrameError, ValueError, FileNotFoundError, KeyError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{args.name}: {manifest['frames']} frames in {args.shards} shard(s) under "
          f"{args.output}; skipped {manifest['skipped']} {manifest['skipped_by_reason']}")
    return 0
