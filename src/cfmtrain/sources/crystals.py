"""The `crystals` preset of `cfmtrain generate`: an MPtrj-like set of any size, made offline.

Periodic crystals of 1-444 atoms (log-normal sizes, median ~20, mean ~31) over 40 elements,
on strained, rattled fcc blocks with random vacancies (~1,000 edges a graph at 4.5 Å), labelled
by a many-element Morse pair potential evaluated over the structure's full neighbour list
(vectorised: ~0.5 ms a frame, where EMT takes ~7). Frame `i` depends only on (seed, i), so a
set is generated shard by shard in parallel processes and is the same for any worker count.
"""

from __future__ import annotations

import json
from pathlib import Path

import ase
import numpy as np
from ase import Atoms
from ase.calculators.morse import fcut, fcut_d
from ase.data import covalent_radii

from cfmtrain import children
from cfmtrain.atomic import atomic_path
from cfmtrain.digest import file_digest
from cfmtrain.frames.extxyz import mace_frame, write_shards
from cfmtrain.frames.neighbors import neighbor_pairs

PRESET = "crystals"
GENERATOR_VERSION = "1"
SUBSET = "crystals"  # the frames' config_type
ATOMS_RANGE = (1, 444)  # MPtrj's atoms per graph (the paper's Table 3)
MEDIAN_ATOMS, SIGMA = 20.0, 0.94  # log-normal: mean = median * exp(sigma^2 / 2) ~ 31
# 40 of MPtrj's elements: light anions (C, N, O, F, P, S, Cl, Se) and metals up to bismuth
ELEMENTS = np.array([3, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 19, 20, 22, 23, 24, 25, 26, 27,
                     28, 29, 30, 31, 32, 34, 38, 39, 40, 41, 42, 46, 47, 48, 50, 56, 57, 74, 79,
                     83])
ELEMENT_COUNTS, ELEMENT_WEIGHTS = (1, 2, 3, 4), (0.2, 0.4, 0.3, 0.1)
RHO0 = 3.0  # Morse stiffness (ASE's rho0: exp(rho0 * (1 - r / r0)))
INNER, OUTER = 3.5, 4.5  # Å: the potential goes smoothly to zero between these (ASE's fcut)
SPACING = (0.86, 0.98)  # nearest-neighbour distance over the elements' mean Morse minimum
STRAIN, RATTLE = 0.03, 0.05  # strain component and rattle (Å) standard deviations


def morse_parameters(numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-atom Morse minimum r0 (Å: twice the covalent radius, clipped to 1.8-3.2) and well
    depth epsilon (eV: 0.2-0.8, fixed by Z); pairs combine them by mean and geometric mean."""
    r0 = np.clip(2 * covalent_radii[numbers], 1.8, 3.2)
    epsilon = 0.2 + 0.6 * np.modf(numbers * 0.618034)[0]
    return r0, epsilon


def morse_labels(atoms: Atoms) -> tuple[float, np.ndarray, np.ndarray]:
    """Energy (eV), forces (eV/Å) and stress (3x3, eV/Å^3, ASE's sign) of the Morse potential
    with per-pair parameters (`morse_parameters`), cut off smoothly at OUTER."""
    positions, cell = atoms.positions, atoms.cell.array
    pairs, shifts, d = neighbor_pairs(positions, cell, atoms.pbc, OUTER, full=True)
    i, j = pairs[:, 0].astype(np.intp), pairs[:, 1].astype(np.intp)
    vectors = positions[j] - positions[i] + shifts @ cell
    d = np.asarray(d, dtype=np.float64)
    r0_atom, eps_atom = morse_parameters(atoms.numbers)
    r0, eps = 0.5 * (r0_atom[i] + r0_atom[j]), np.sqrt(eps_atom[i] * eps_atom[j])
    expf = np.exp(RHO0 * (1.0 - d / r0))
    pair = eps * expf * (expf - 2.0)
    cut = fcut(d, INNER, OUTER)
    energy = 0.5 * float((pair * cut).sum())  # a full list holds each pair twice
    de = (-2.0 * eps * RHO0 / r0) * expf * (expf - 1.0) * cut + pair * fcut_d(d, INNER, OUTER)
    along = (de / d)[:, None] * vectors
    forces = np.stack([np.bincount(i, along[:, k], len(atoms)) for k in range(3)], axis=1)
    stress = 0.5 * (vectors.T @ along) / atoms.get_volume()
    return energy, forces, stress


def atom_count(rng: np.random.Generator) -> int:
    """Atoms of one structure: log-normal around MEDIAN_ATOMS, within ATOMS_RANGE."""
    low, high = ATOMS_RANGE
    return int(np.clip(round(rng.lognormal(np.log(MEDIAN_ATOMS), SIGMA)), low, high))


FCC_BASIS = np.array([[0.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.5, 0.0, 0.5], [0.5, 0.5, 0.0]])


def _cells(n: int) -> tuple[int, int, int]:
    """A near-cubic block of fcc cells with at least n sites."""
    cells = -(-n // len(FCC_BASIS))
    a = max(1, round(cells ** (1 / 3)))
    b = max(1, round((cells / a) ** 0.5))
    return a, b, -(-cells // (a * b))


def crystal(rng: np.random.Generator) -> Atoms:
    """One structure: 1-4 elements on a strained, rattled, partly vacant fcc block."""
    n = atom_count(rng)
    k = rng.choice(ELEMENT_COUNTS, p=ELEMENT_WEIGHTS)
    numbers = rng.choice(rng.choice(ELEMENTS, size=k, replace=False), size=n)
    dims = np.array(_cells(n))
    corners = np.stack(np.meshgrid(*(np.arange(m) for m in dims), indexing="ij"), -1)
    sites = (corners.reshape(-1, 1, 3) + FCC_BASIS).reshape(-1, 3)
    chosen = sites[rng.choice(len(sites), size=n, replace=False)]
    # nearest-neighbour distance about the elements' mean Morse minimum
    lattice = np.sqrt(2) * morse_parameters(numbers)[0].mean() * rng.uniform(*SPACING)
    strain = np.eye(3) + rng.normal(0.0, STRAIN, (3, 3))
    cell = np.diag(dims * lattice) @ strain
    positions = chosen / dims @ cell + rng.normal(0.0, RATTLE, (n, 3))
    return Atoms(numbers, positions=np.round(positions, 8), cell=cell, pbc=True)


def make_frame(seed: int, index: int) -> Atoms:
    """Frame `index` of the set of `seed`: built from its own random stream, then labelled."""
    atoms = crystal(np.random.default_rng([seed, index]))
    energy, forces, stress = morse_labels(atoms)
    return mace_frame(atoms, energy, forces, stress, config_type=SUBSET)


def shard_ranges(graphs: int, num_shards: int) -> list[range]:
    """Frame indices of each shard: contiguous, sizes differing by at most one."""
    bounds = np.linspace(0, graphs, num_shards + 1).round().astype(int)
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _write_shard(task: tuple[int, range, Path]) -> dict:
    seed, frames, path = task
    write_shards((make_frame(seed, i) for i in frames), [path])
    return {"file": path.name, "frames": len(frames), "first": frames.start,
            "sha256": file_digest(path)}


def generate_crystals(output_dir: str | Path, graphs: int, seed: int = 0, num_shards: int = 1,
                      workers: int = 1) -> dict:
    """Write `graphs` frames as `frames_XXXX.extxyz` shards (one process per shard, `workers`
    at a time) plus `manifest.json` (last); return the manifest."""
    for name, value, least in (("graphs", graphs, 1), ("num_shards", num_shards, 1),
                               ("seed", seed, 0)):
        if int(value) != value or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value}")
    if num_shards > graphs:
        raise ValueError(f"num_shards ({num_shards}) exceeds graphs ({graphs}): a shard would "
                         "be empty")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)  # never a manifest beside other shards
    tasks = [(int(seed), frames, out / f"frames_{k:04d}.extxyz")
             for k, frames in enumerate(shard_ranges(int(graphs), int(num_shards)))]
    if workers <= 1:
        shards = [_write_shard(t) for t in tasks]
    else:
        with children.pool(min(workers, len(tasks))) as pool:
            shards = pool.map(_write_shard, tasks, chunksize=1)
    manifest = {
        "dataset": PRESET, "preset": PRESET, "generator_version": GENERATOR_VERSION,
        "ase_version": ase.__version__, "seed": int(seed), "num_shards": len(shards),
        "total_frames": int(graphs), "shards": shards,
        "frames_per_subset": {SUBSET: int(graphs)},
        "description": __doc__.split("\n\n")[1].replace("\n", " "),
    }
    with atomic_path(out / "manifest.json") as tmp:
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
