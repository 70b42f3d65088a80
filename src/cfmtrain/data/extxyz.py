"""Extxyz frames with MACE's keys (REF_energy, REF_forces, REF_stress, config_type).

Labelling a structure, and writing frames round-robin into shards through `atomic_path`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

import ase.io
import numpy as np
from ase import Atoms

from cfmtrain.atomic import atomic_path

ENERGY_KEY, FORCES_KEY, STRESS_KEY, CONFIG_TYPE_KEY = (
    "REF_energy", "REF_forces", "REF_stress", "config_type")


def mace_frame(
    atoms: Atoms,
    energy: float,
    forces: np.ndarray,
    stress: np.ndarray | None = None,
    config_type: str | None = None,
) -> Atoms:
    """A calculator-free copy of `atoms` carrying labels under MACE's keys.

    `stress` is a 3x3 matrix in eV/Å^3 with ASE's sign, or None to omit it.
    """
    forces = np.asarray(forces, dtype=float)
    if forces.shape != (len(atoms), 3):
        raise ValueError(f"forces have shape {forces.shape}, expected ({len(atoms)}, 3)")
    if not np.isfinite(energy) or not np.isfinite(forces).all():
        raise ValueError(f"non-finite energy or forces for {atoms.get_chemical_formula()}")
    frame = Atoms(atoms.numbers, positions=atoms.positions, cell=atoms.cell, pbc=atoms.pbc)
    frame.info[ENERGY_KEY] = float(energy)
    if stress is not None:
        stress = np.asarray(stress, dtype=float)
        if stress.shape != (3, 3) or not np.isfinite(stress).all():
            raise ValueError(f"stress must be a finite 3x3 matrix, got {stress!r}")
        frame.info[STRESS_KEY] = stress
    if config_type is not None:
        frame.info[CONFIG_TYPE_KEY] = config_type
    frame.arrays[FORCES_KEY] = forces
    return frame


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_shards(frames: Iterable[Atoms], paths: list[Path]) -> list[dict]:
    """Write `frames` round-robin into the extxyz files `paths`, each atomically.

    Returns one record per shard: {"file", "frames", "sha256"}. Nothing appears under the
    final names unless every frame was written.
    """
    counts = [0] * len(paths)
    with contextlib.ExitStack() as stack:
        tmps = [stack.enter_context(atomic_path(p)) for p in paths]
        handles = [stack.enter_context(open(t, "w")) for t in tmps]
        for i, frame in enumerate(frames):
            k = i % len(paths)
            ase.io.write(handles[k], frame, format="extxyz")
            counts[k] += 1
    # the stack closed each handle before its atomic_path renamed it (last in, first out)
    return [{"file": p.name, "frames": n, "sha256": sha256_file(p)}
            for p, n in zip(paths, counts, strict=True)]
