"""Structure builders for the `mini` data set: one seeded builder per subset (unlabelled Atoms).

Metals use EMT's elements; water is rigid TIP3P geometry packed by configurational-bias insertion.
"""

from __future__ import annotations

import functools

import numpy as np
from ase import Atoms
from ase.build import bulk, fcc100, fcc111, make_supercell, niggli_reduce
from ase.calculators.tip3p import angleHOH, epsilon0, qH, rOH, sigma0
from ase.units import Bohr, Hartree
from matscipy.neighbours import neighbour_list
from scipy.spatial.distance import pdist

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
    if not periodic.any():
        return d
    return d - np.where(periodic, np.round(d / lengths), 0.0) * lengths


def _insertion_energy(cand, placed, lengths, periodic):
    """TIP3P energy of each candidate molecule with the placed ones, and its closest H contact."""
    raw = placed[None, :, 0] - cand[:, None, 0]
    doo = _min_image(raw, lengths, periodic)  # (C, M, 3)
    roo = np.sqrt(np.einsum("cmk,cmk->cm", doo, doo))
    cols = np.flatnonzero((roo < TIP3P_RC).any(axis=0))
    doo, roo, shift = doo[:, cols], roo[:, cols], (doo - raw)[:, cols]
    d = placed[None, cols, None] - cand[:, None, :, None] + shift[:, :, None, None]  # (C,M,3,3,3)
    r = np.sqrt(np.einsum("...k,...k->...", d, d))
    coulomb = (_COULOMB * np.outer(_CHARGES, _CHARGES) / r).sum(axis=(2, 3))
    c6 = (sigma0 / roo) ** 6
    pair = np.where(roo < TIP3P_RC, 4 * epsilon0 * (c6 * c6 - c6) + coulomb, 0.0)
    r[:, :, 0, 0] = np.inf  # O-O is checked separately
    contact = r.min(axis=(1, 2, 3)) if len(cols) else np.full(len(cand), np.inf)
    return pair.sum(axis=1), contact


def _choose(rng, cand, placed, lengths, periodic) -> np.ndarray | None:
    """Boltzmann-choose one clash-free candidate (a molecule orientation), or None."""
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
    out, n = np.zeros((n_mol, 3, 3)), 0
    oriented = np.zeros((0, 3, 3))  # a supply of randomly rotated molecules at the origin
    for _ in range(400 * n_mol):
        if n == n_mol:
            return out.reshape(-1, 3)
        placed = out[:n]
        if cluster and n:
            anchor = placed[rng.integers(n, size=128), 0]
            u = rng.normal(size=(128, 3))
            centres = anchor + u / np.linalg.norm(u, axis=1, keepdims=True) * rng.uniform(
                2.6, 3.1, size=(128, 1))
        else:
            centres = rng.random((16, 3)) * lengths
        doo = _min_image(placed[None, :, 0] - centres[:, None], lengths, periodic)
        free = np.flatnonzero(np.all(np.einsum("cmk,cmk->cm", doo, doo) >= MIN_OO**2, axis=1))
        if len(free) == 0:
            continue
        sites = np.repeat(centres[free[: 4 if cluster else 1]], 12, axis=0)  # a few orientations
        if len(oriented) < len(sites):
            oriented = np.einsum("cij,aj->cai", _rotations(rng, 1536), _WATER_LOCAL)
        cand, oriented = sites[:, None] + oriented[: len(sites)], oriented[len(sites):]
        choice = _choose(rng, cand, placed, lengths, periodic)
        if choice is not None:
            out[n], n = choice, n + 1
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


def _fcc_a(symbols) -> float:
    """fcc lattice constant of an alloy: the mean volume per atom of its elements (Vegard)."""
    return float(np.mean([A_FCC[s] ** 3 for s in symbols]) ** (1 / 3))


def _random_species(rng, n: int, elements) -> list[str]:
    """`n` symbols drawn from `elements` with a random (Dirichlet) composition."""
    fractions = rng.dirichlet(np.full(len(elements), 2.0))
    return [elements[i] for i in rng.choice(len(elements), size=n, p=fractions)]


def _strain(atoms: Atoms, rng, sigma: float) -> None:
    """Apply a random symmetric strain (components ~ N(0, sigma)) to cell and positions."""
    eps = rng.normal(0.0, sigma, size=(3, 3))
    atoms.set_cell(atoms.cell[:] @ (np.eye(3) + (eps + eps.T) / 2), scale_atoms=True)


def closest_contact(atoms: Atoms, within: float) -> float:
    """The shortest interatomic distance (all periodic images) if below `within`, else inf."""
    if len(atoms) < 2 and not atoms.pbc.any():
        return float("inf")
    d = pdist(atoms.positions) if not atoms.pbc.any() else neighbour_list("d", atoms, within)
    return float(d.min()) if len(d) and d.min() < within else float("inf")


def _rattle(atoms: Atoms, rng, sigma: float, min_dist: float = MIN_METAL_DIST) -> None:
    """Gaussian displacements, redrawn smaller until no two atoms are closer than `min_dist`."""
    base = atoms.positions.copy()
    for _ in range(30):
        atoms.positions = base + rng.normal(0.0, sigma, size=base.shape)
        if closest_contact(atoms, min_dist) >= min_dist:
            return
        sigma *= 0.7
    raise RuntimeError(f"cannot rattle {atoms.get_chemical_formula()} above {min_dist} Å")


def _remove_random(atoms: Atoms, rng, count: int) -> Atoms:
    """Delete `count` random atoms (vacancies)."""
    if count > 0:
        del atoms[rng.choice(len(atoms), size=count, replace=False).tolist()]
    return atoms


def cuni(rng: np.random.Generator) -> Atoms:
    """Random fcc Cu(x)Ni(1-x), 5x5x5 cubic cells with 0-8 vacancies (492-500 atoms)."""
    atoms = bulk("Cu", "fcc", a=1.0, cubic=True).repeat(5)
    atoms.symbols = _random_species(rng, len(atoms), ["Cu", "Ni"])
    atoms.set_cell(atoms.cell * _fcc_a(atoms.get_chemical_symbols()), scale_atoms=True)
    _remove_random(atoms, rng, int(rng.integers(0, 9)))
    _strain(atoms, rng, 0.01)
    _rattle(atoms, rng, rng.uniform(0.03, 0.12))
    return atoms


def hea(rng: np.random.Generator) -> Atoms:
    """Five-element random fcc/bcc alloys of EMT metals, 36 or 48 atoms like HEA25."""
    elements = sorted(rng.choice(METALS, size=5, replace=False).tolist())
    lattice, reps = [("fcc", (3, 3, 1)), ("fcc", (2, 2, 3)), ("bcc", (3, 3, 2)),
                     ("bcc", (2, 3, 4))][rng.integers(4)]
    atoms = bulk("Cu", lattice, a=1.0, cubic=True).repeat(reps)
    atoms.symbols = _random_species(rng, len(atoms), elements)
    a = _fcc_a(atoms.get_chemical_symbols()) * (1.0 if lattice == "fcc" else 2 ** (-1 / 3))
    atoms.set_cell(atoms.cell * a, scale_atoms=True)
    _strain(atoms, rng, 0.015)
    _rattle(atoms, rng, rng.uniform(0.03, 0.15))
    return atoms


def _prototype(kind: str, elements: list[str], rng) -> Atoms:
    """A unit cell (lattice constant 1) of `kind`; ordered kinds use two sublattices."""
    if kind in ("fcc", "bcc", "sc"):
        atoms = bulk("Cu", kind, a=1.0)
    elif kind == "hcp":
        atoms = bulk("Cu", "hcp", a=1.0, c=np.sqrt(8 / 3) * rng.uniform(0.95, 1.05))
    else:
        atoms = bulk("Cu", "bcc" if kind == "B2" else "fcc", a=1.0, cubic=True)
    if kind in ("L12", "L10", "B2"):
        sub_b = {"L12": [0], "L10": [1, 2], "B2": [1]}[kind]
        atoms.symbols = [elements[1] if i in sub_b else elements[0] for i in range(len(atoms))]
        if kind == "L10":
            atoms.set_cell(atoms.cell[:] * [1, 1, rng.uniform(0.9, 1.0)], scale_atoms=True)
    else:
        atoms.symbols = [elements[0]] * len(atoms)
    return atoms


@functools.cache
def _diagonal_triple(p: int) -> tuple[int, int, int]:
    """The most cube-like (n1, n2, n3) with n1 * n2 * n3 == p."""
    triples = [(i, j, p // (i * j)) for i in range(1, p + 1) if p % i == 0
               for j in range(1, p // i + 1) if (p // i) % j == 0]
    return min(triples, key=lambda t: (max(t) / min(t), t))


@functools.cache
def _compact_counts(most: int) -> tuple[int, ...]:
    """Counts 1..most whose most cube-like diagonal supercell has sides within a factor 2."""
    return tuple(p for p in range(1, most + 1) if max(t := _diagonal_triple(p)) <= 2 * min(t))


def _compact_count(wanted: float, most: int) -> int:
    """The compact count nearest `wanted` (on a log scale)."""
    return min(_compact_counts(most), key=lambda p: (abs(np.log(p / max(wanted, 1.0))), p))


def _supercell(atoms: Atoms, rng, copies: int) -> Atoms:
    """`copies` copies of the cell, diagonal or skewed (Hermite normal form), Niggli-reduced."""
    matrix = np.diag(_diagonal_triple(copies))
    if copies > 1 and rng.random() < 0.5:
        for i, j in ((1, 0), (2, 0), (2, 1)):
            matrix[i, j] = rng.integers(0, matrix[i, i])
    big = make_supercell(atoms, matrix)
    niggli_reduce(big)
    return big


def _fit_volume(atoms: Atoms, factor: float) -> None:
    """Scale the cell so the volume per atom is the alloy's fcc value times `factor`."""
    per_atom = _fcc_a(atoms.get_chemical_symbols()) ** 3 / 4 * factor
    scale = (per_atom * len(atoms) / atoms.get_volume()) ** (1 / 3)
    atoms.set_cell(atoms.cell[:] * scale, scale_atoms=True)


def mptrj(rng: np.random.Generator, index: int) -> Atoms:
    """Diverse strained and rattled crystals (1-444 atoms, skewed small like MPtrj).

    Frame 0 is always a one-atom cell (smaller than the cutoff) and frame 1 a 444-atom one.
    """
    n_el = int(rng.choice([1, 2, 3, 4], p=[0.2, 0.4, 0.3, 0.1]))
    elements = rng.choice(METALS, size=n_el, replace=False).tolist()
    kinds = ["fcc", "bcc", "hcp", "sc", "fcc_cubic", "disordered"]
    kinds += ["L12", "L10", "B2"] if n_el == 2 else []
    kind = kinds[rng.integers(len(kinds))] if index > 1 else ["fcc", "fcc_cubic"][index]
    atoms = _prototype("fcc_cubic" if kind == "disordered" else kind, elements, rng)
    target = 1 if index == 0 else 448 if index == 1 else np.exp(rng.normal(np.log(16), 0.9))
    copies = _compact_count(target / len(atoms), 448 // len(atoms))
    atoms = _supercell(atoms, rng, copies)
    if kind not in ("L12", "L10", "B2"):
        atoms.symbols = _random_species(rng, len(atoms), elements)
    _remove_random(atoms, rng, len(atoms) - 444)
    _fit_volume(atoms, rng.uniform(0.95, 1.1) * (1.15 if kind == "sc" else 1.0))
    _strain(atoms, rng, rng.uniform(0.0, 0.03))
    _rattle(atoms, rng, rng.uniform(0.15, 0.25) if kind == "disordered" else rng.uniform(0.01, 0.1))
    return atoms


def tmd(rng: np.random.Generator) -> Atoms:
    """TMD-like layered cells (16-96 atoms): three-plane M/X sheets, vdW gaps or vacuum."""
    (nx, ny), sheets = [((2, 3), 1), ((3, 3), 1), ((2, 4), 1), ((3, 4), 1), ((4, 4), 1),
                        ((2, 2), 2), ((2, 3), 2), ((3, 3), 2), ((3, 4), 2), ((4, 4), 2)][
        rng.integers(10)]
    metal, outer = rng.choice(["Pt", "Pd", "Ni", "Au"]), rng.choice(["Cu", "Ag", "Al", "Au"])
    sheet = fcc111("Cu", (nx, ny, 3), a=1.0)
    sheet.symbols = [metal if tag == 2 else outer for tag in sheet.get_tags()]
    a = _fcc_a(sheet.get_chemical_symbols())
    sheet.positions *= a
    sheet.cell = sheet.cell[:] * a
    thickness = 2 * a / np.sqrt(3)
    gap = rng.uniform(2.6, 3.4) if sheets == 2 else rng.uniform(10.0, 14.0)  # vdW gap / vacuum
    stacking = (sheet.cell[0] / nx + sheet.cell[1] / ny) / 3
    atoms = Atoms(cell=sheet.cell, pbc=True)
    for k in range(sheets):
        layer = sheet.copy()
        layer.positions += [0.0, 0.0, k * (thickness + gap)] + (k % 2) * stacking
        atoms += layer
    atoms.cell[2] = [0, 0, sheets * (thickness + gap)]
    atoms.wrap()
    _remove_random(atoms, rng, int(rng.integers(0, 3)))
    _strain(atoms, rng, 0.015)
    _rattle(atoms, rng, rng.uniform(0.02, 0.1))
    return atoms


def zeolite(rng: np.random.Generator) -> Atoms:
    """Zeolite-like porous frameworks (203-408 atoms): Al/Cu/Ni fcc cut by three channels."""
    target = int(rng.integers(203, 409))
    cells = target / rng.uniform(0.62, 0.78) / 4  # cubic cells to keep 62-78% of the sites
    n = round(cells ** (1 / 3))
    reps = min(((i, j, k) for i in (n, n + 1) for j in (n, n + 1) for k in (n - 1, n, n + 1)
                if i * j * k >= cells), key=lambda t: (t[0] * t[1] * t[2], t))
    atoms = bulk("Al", "fcc", a=1.0, cubic=True).repeat(reps)
    assert len(atoms) >= target
    atoms.symbols = [["Al", "Cu", "Ni"][i] for i in rng.choice(3, len(atoms), p=[0.7, 0.2, 0.1])]
    _fit_volume(atoms, 1.0)
    lengths = atoms.cell.lengths()
    axes = rng.random((3, 3)) * lengths  # one channel along each axis through a random point
    radial = []
    for axis in range(3):
        d = _min_image(atoms.positions - axes[axis], lengths, np.ones(3, bool))
        d[:, axis] = 0.0
        radial.append(np.linalg.norm(d, axis=1) / lengths.mean())
    closest = np.min(radial, axis=0) + rng.normal(0, 0.01, len(atoms))  # rough channel walls
    del atoms[np.argsort(closest)[: len(atoms) - target].tolist()]
    _strain(atoms, rng, 0.01)
    _rattle(atoms, rng, rng.uniform(0.02, 0.1))
    return atoms


def al_hcl(rng: np.random.Generator) -> Atoms:
    """Al(100) slab (125 atoms) below a TIP3P water layer (52 waters): 281 atoms, periodic.

    The metal and the water are separate subsystems (labelled by EMT and TIP3P without a
    metal-water interaction); a 3 Å gap separates them on both sides.
    """
    slab = fcc100("Al", (5, 5, 5), a=A_FCC["Al"], orthogonal=True)
    top = slab.positions[:, 2].max()
    lengths = np.array([slab.cell[0, 0], slab.cell[1, 1], 0.0])
    lengths[2] = water_box_length(52) ** 3 / (lengths[0] * lengths[1])
    slab.cell = [lengths[0], lengths[1], top + 3.0 + lengths[2] + 3.0]
    slab.pbc = True
    _rattle(slab, rng, rng.uniform(0.03, 0.1))
    water = pack_water(rng, 52, lengths, periodic=(True, True, False))
    water[:, 2] += top + 3.0
    return slab + Atoms("OH2" * 52, positions=water)


BUILDERS = {
    "water_clusters": lambda rng, index: water_cluster(rng),
    "liquid_water": lambda rng, index: liquid_water(rng),
    "cuni": lambda rng, index: cuni(rng),
    "hea": lambda rng, index: hea(rng),
    "mptrj": mptrj,
    "tmd": lambda rng, index: tmd(rng),
    "zeolite": lambda rng, index: zeolite(rng),
    "al_hcl": lambda rng, index: al_hcl(rng),
}
