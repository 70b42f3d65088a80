"""The pipeline's extxyz shards (`frames_0000.extxyz`, ...): frames with MACE's keys
(shards.parts deals them round-robin), plus `manifest.json`, written last. A conversion's
outputs are staged in a hidden folder and replace the previous ones only when the whole
conversion succeeded: a failed re-convert leaves the previous good output as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from ase import Atoms

from cfmtrain import crash
from cfmtrain.children import pid_alive
from cfmtrain.diskfull import writing
from cfmtrain.frames.labels import CONFIG_TYPE_KEY, ENERGY_KEY, FORCES_KEY, STRESS_KEY
from cfmtrain.frames.validate import (
    Limits,
    RawFrame,
    frame_labels,
)
from cfmtrain.shards.sources import source_record

SHARD_NAME = "frames_{:04d}.extxyz"
MANIFEST = "manifest.json"
OUTPUT_GLOBS = ("frames_*.extxyz", "e0s.json", MANIFEST)  # what a conversion writes


def build_atoms(frame: RawFrame, config_type: str) -> Atoms:
    """The checked frame as ase.Atoms with MACE's keys (REF_energy, REF_forces, REF_stress)."""
    energy, forces, stress = frame_labels(frame)
    atoms = Atoms(numbers=frame.numbers, positions=frame.positions, cell=frame.cell,
                  pbc=frame.pbc)
    atoms.info.update(frame.info)
    atoms.info[ENERGY_KEY] = energy
    if stress is not None:
        atoms.info[STRESS_KEY] = stress
    atoms.info.setdefault(CONFIG_TYPE_KEY, config_type)  # own data's frames keep their own
    atoms.arrays[FORCES_KEY] = forces
    for key, value in frame.arrays.items():
        atoms.arrays[key] = np.asarray(value)
    return atoms


class Staging:
    """A conversion's new outputs, written into a hidden folder inside `output_dir` and moved
    over the previous ones by `commit` (the old manifest first goes, the new one comes last);
    outputs of the previous conversion that this one did not write (frames_*.extxyz beyond the
    new shard count, e0s.json) are then removed."""

    def __init__(self, output_dir: str | os.PathLike) -> None:
        self.output_dir = Path(output_dir)
        with writing(self.output_dir):
            self.output_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.output_dir.glob(".staging-*"):  # of a conversion killed outright
            if not pid_alive(stale.name.removeprefix(".staging-")):
                shutil.rmtree(stale, ignore_errors=True)
        self.folder = self.output_dir / f".staging-{os.getpid()}"
        shutil.rmtree(self.folder, ignore_errors=True)
        crash.leftover(self.folder)
        with writing(self.folder):
            self.folder.mkdir()

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


def shard_paths(folder: Path, num_shards: int) -> list[Path]:
    """The `num_shards` frame shards of a folder (ValueError below one)."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    return [Path(folder) / SHARD_NAME.format(k) for k in range(num_shards)]


def unique_files(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], dict[Path, dict]]:
    """`paths` without repeats: one file listed under several spellings (a/x.xyz, a/../a/x.xyz,
    a symlink) or two files of identical content are read once, the first listed kept, and a
    warning names the others. Returns (the kept paths, their manifest records by path: size,
    sha256 and stamp, taken before the conversion reads them)."""
    kept: list[Path] = []
    records: dict[Path, dict] = {}
    seen: dict[str, Path] = {}  # real path or content hash -> the kept path
    for path in map(Path, paths):
        real = os.path.realpath(path)
        if real in seen:
            warnings.warn(f"{path}: the same file as {seen[real]}; read once", stacklevel=2)
            continue
        record = source_record(path)
        if record["sha256"] in seen:
            warnings.warn(f"{path}: the same content as {seen[record['sha256']]}; read once",
                          stacklevel=2)
            continue
        seen[real] = seen[record["sha256"]] = path
        kept.append(path)
        records[path] = record
    return kept, records


def manifest(head: dict, files: list[Path], records: dict[Path, dict], options: dict,
             limits: Limits, num_shards: int, counts: dict) -> dict:
    """A conversion's manifest: `head` (data set, kind), its input files (`records`: path,
    size, sha256 and stamp; cfmtrain.shards.sources), the read `options`, the label limits, the
    shard names and the writer's counts."""
    return {**head, "sources": [records[p] for p in files],
            **options, "limits": limits_record(limits), "num_shards": num_shards,
            "shards": [SHARD_NAME.format(k) for k in range(num_shards)], **counts}


def write_manifest(folder: Path, record: dict) -> None:
    """`manifest.json` into the staging `folder` (a conversion's last file)."""
    with writing(folder / MANIFEST):
        (folder / MANIFEST).write_text(json.dumps(record, indent=2) + "\n")


def limits_record(limits: Limits) -> dict[str, float]:
    """The label limits, for manifests."""
    return {"max_energy_per_atom": limits.max_energy_per_atom, "max_force": limits.max_force,
            "max_stress": limits.max_stress}
