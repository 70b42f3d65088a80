"""Structure builders for the `mini` data set: one seeded builder per subset (unlabelled Atoms).

Metals use EMT's elements; water is rigid TIP3P geometry packed by configurational-bias insertion.
"""

from __future__ import annotations

import numpy as np
from ase import Atoms
from ase.build import bulk, fcc100, fcc111, make_supercell, niggli_reduce
from ase.calculators.tip3p import angleHOH, epsilon0, qH, rOH, sigma0
from ase.neighborlist import neighbor_list
from ase.units import Bohr, Hartree

# fcc lattice constants (Å) of EMT's seven metals; alloys use the mean volume per atom.
A_FCC = {"Al": 4.05, "Cu": 3.61, "Ag": 4.09, "Au": 4.08, "Ni": 3.52, "Pd": 3.89, "Pt": 3.92}
METALS = tuple(A_FCC)
MIN_METAL_DIST = 2.0  # Å, closest metal-metal contact a builder accepts
MIN_OO, MIN_H_CONTACT = 2.5, 1.5  # Å, closest intermolecular O-O and H-involving contacts
WATER_KT = 0.05  # eV, temperature of the insertion's Boltzmann choice
WATER_DENSITY = 1.0  # g/cm^3
TIP3P_RC = 7.0  # Å, TIP3P's O-O cutoff used for labels (periodic cells need >= 2 * rc)
_COULOMB = Hartree * Bohr
_CHARGES = np.array([-2.0 * qH, qH, qH])
_HALF = np.deg2rad(angleHOH) / 2
_WATER_LOCAL = np.array(
    [[0.0, 0.0, 0.0], [rOH * np.sin(_HALF), rOH * np.cos(_HALF), 0.0],
     [-rOH * np.sin(_HALF), rOH * np.cos(_HALF), 0.0]]
)


def water_box_length(n_mol: int, density: float = WATER_DENSITY) -> float:
    """Edge (Å) of a cube holding `n_mol` water molecules at `density` g/cm^3."""
    volume = n_mol * 18.015 / 0.602214076 / density
    return float(volume ** (1 / 3))


def _rotations(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` uniformly random rotation matrices (from normalised Gaussian quaternions)."""
    q = rng.normal(size=(n, 4))
    w, x, y, z = (q / np.linalg.norm(q, axis=1, keepdims=True)).T
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
        np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
        np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
    ], axis=1)


def _min_image(d: np.ndarray, lengths: np.ndarray, periodic: np.ndarray) -> np.ndarray:
    """Minimum-image displacement in an orthorhombic cell (non-periodic axes unchanged)."""
    wrap = np.where(periodic, np.round(d / lengths), 0.0)
    return d - wrap * lengths


def _insertion_energy(cand, placed, lengths, periodic):
    """TIP3P energy of each candidate molecule with the placed ones, and its closest H contact."""
    doo = _min_image(placed[None, :, 0] - cand[:, None, 0], lengths, periodic)  # (C, M, 3)
    shift = doo - (placed[None, :, 0] - cand[:, None, 0])
    roo = np.linalg.norm(doo, axis=-1)
    near = roo < TIP3P_RC
    d = placed[None, :, None] - cand[:, None, :, None] + shift[:, :, None, None]  # (C,M,3,3,3)
    r = np.linalg.norm(d, axis=-1)
    coulomb = (_COULOMB * np.outer(_CHARGES, _CHARGES) / r).sum(axis=(2, 3))
    c6 = (sigma0 / roo) ** 6
    energy = np.where(near, 4 * epsilon0 * (c6 * c6 - c6) + coulomb, 0.0).sum(axis=1)
    r[:, :, 0, 0] = np.inf  # O-O is checked separately
    return energy, r.min(axis=(1, 2, 3))


def _choose(rng, cand, placed, lengths, periodic) -> np.ndarray | None:
    """Boltzmann-choose one clash-free candidate orientation, or None."""
    if len(placed) == 0:
        return cand[0]
    energy, contact = _insertion_energy(cand, placed, lengths, periodic)
    ok = np.flatnonzero(contact >= MIN_H_CONTACT)
    if len(ok) == 0:
        return None
    weights = np.exp(-(energy[ok] - energy[ok].min()) / WATER_KT)
    return cand[ok[rng.choice(len(ok), p=weights / weights.sum())]]


def pack_water(
    rng: np.random.Generator, n_mol: int, lengths=None, periodic=(False,) * 3, cluster=False
) -> np.ndarray:
    """Positions (3 n_mol, 3), order O,H,H per molecule, of rigid TIP3P waters.

    `cluster=True` grows a compact cluster from one molecule; otherwise O atoms fill the box
    `[0, lengths)` with periodic minimum images along `periodic` axes.
    """
    lengths = np.ones(3) if lengths is None else np.asarray(lengths, float)
    periodic = np.asarray(periodic, bool)
    placed = np.zeros((0, 3, 3))
    for _ in range(400 * n_mol):
        if len(placed) == n_mol:
            return placed.reshape(-1, 3)
        if cluster and len(placed):
            anchor = placed[rng.integers(len(placed), size=128), 0]
            u = rng.normal(size=(128, 3))
            centres = anchor + u / np.linalg.norm(u, axis=1, keepdims=True) * rng.uniform(
                2.6, 3.1, size=(128, 1))
        else:
            centres = rng.random((256, 3)) * lengths
        doo = _min_image(placed[None, :, 0] - centres[:, None], lengths, periodic)
        free = centres[np.all(np.linalg.norm(doo, axis=-1) >= MIN_OO, axis=1)][:8]
        if len(free) == 0:
            continue
        centres = np.repeat(free, 3, axis=0)
        cand = centres[:, None] + np.einsum("cij,aj->cai", _rotations(rng, len(centres)),
                                            _WATER_LOCAL)
        choice = _choose(rng, cand, placed, lengths, periodic)
        if choice is not None:
            placed = np.concatenate([placed, choice[None]])
    raise RuntimeError(f"could not pack {n_mol} water molecules in a box of {lengths} Å")


def water_cluster(rng: np.random.Generator) -> Atoms:
    """A non-periodic cluster of 3-25 waters (9-75 atoms), like HydroNet's."""
    n_mol = int(rng.integers(3, 26))
    pos = pack_water(rng, n_mol, cluster=True)
    return Atoms("OH2" * n_mol, positions=pos - pos.mean(axis=0), pbc=False)


def liquid_water(rng: np.random.Generator) -> Atoms:
    """256 waters (768 atoms) in a periodic cube at 0.97-1.03 g/cm^3."""
    length = water_box_length(256, rng.uniform(0.97, 1.03))
    pos = pack_water(rng, 256, [length] * 3, periodic=(True,) * 3)
    return Atoms("OH2" * 256, positions=pos, cell=[length] * 3, pbc=True)
