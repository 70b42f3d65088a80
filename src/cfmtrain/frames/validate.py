"""The one check of a labelled frame that every stage shares (`cfmtrain convert`, `graphs`).

Frames are checked in batches, each check vectorised over the batch's concatenated arrays; a
frame's result is its first problem in a fixed order of checks, as (reason, detail).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from ase import Atoms
from ase.stress import voigt_6_to_full_3x3_stress

from cfmtrain.frames.labels import CONFIG_TYPE_KEY, ENERGY_KEY, FORCES_KEY, KEYS, STRESS_KEY

MIN_DISTANCE = 0.1  # Angstrom: closer atoms are an error
# The overlap search runs vesin (cfmtrain.frames.neighbors) at this radius and keeps pairs below
# MIN_DISTANCE: vesin bins space by its cutoff, and 0.1 A bins make it ~20-1000x slower (88 ms
# vs 4 ms for 768 atoms of water).
OVERLAP_SEARCH_RADIUS = 2.0
MIN_ABS_DET = 1e-6  # A^3 (A^2, A): a smaller volume (area, length) of the periodic vectors is
# singular; a non-periodic vector is free (a slab with pbc T T F may have a zero c vector)
Problem = tuple[str, str]  # (reason, detail)


@dataclass(frozen=True)
class Limits:
    """The largest label magnitudes accepted; larger ones are refused as absurd.

    Far above physical values, far below what overflows a loss: |E|/atom 1e6 eV exceeds the
    all-electron total energy of every element up to Z ~ 100 (uranium: ~7.6e5 eV), a 1e4 eV/A
    force component is ~100x the largest in MPtrj, 1e3 eV/A^3 of stress is 160 TPa.
    """

    max_energy_per_atom: float = 1e6  # eV/atom, |E| / number of atoms
    max_force: float = 1e4  # eV/A, any force component
    max_stress: float = 1e3  # eV/A^3, any stress component

    def __post_init__(self) -> None:
        for name in ("max_energy_per_atom", "max_force", "max_stress"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < np.inf):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")


LIMITS = Limits()


class InvalidFrameError(ValueError):
    """A frame that cannot be used; the message names the file, the frame and the reason."""

    def __init__(self, source: str, index: int | str, reason: str, detail: str) -> None:
        self.source, self.index, self.reason, self.detail = source, index, reason, detail
        super().__init__(format_problem(source, index, reason, detail))

    def __reduce__(self):  # raised in a conversion's worker process, re-raised in its parent
        return type(self), (self.source, self.index, self.reason, self.detail)


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
    problem: Problem | None = None  # set by a reader for malformed records


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


def raw_from_atoms(atoms: Atoms, source: str, index: int | str, energy_key: str = ENERGY_KEY,
                   forces_key: str = FORCES_KEY, stress_key: str | None = STRESS_KEY,
                   stress_factor: float = 1.0, keep_info: bool = True) -> RawFrame:
    """Wrap an ase.Atoms and its labels (under the given keys) as a RawFrame; its scalar info
    entries other than the labels are kept (to be written out again) if `keep_info`."""
    info = {}
    if keep_info:
        labels = {energy_key, forces_key, stress_key, CONFIG_TYPE_KEY}
        info = {k: v for k, v in atoms.info.items()
                if k not in labels and isinstance(v, (str, int, float, np.integer, np.floating))}
        if CONFIG_TYPE_KEY in atoms.info:
            info["source_config_type"] = atoms.info[CONFIG_TYPE_KEY]
    return RawFrame(
        source=source, index=index, numbers=atoms.arrays["numbers"],
        positions=atoms.arrays["positions"], cell=atoms.cell.array, pbc=atoms.pbc,
        energy=read_label(atoms, energy_key), forces=read_label(atoms, forces_key, per_atom=True),
        stress=read_label(atoms, stress_key), stress_factor=stress_factor, info=info,
    )


class _Problem(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


def _stress_3x3(stress: object) -> np.ndarray | None:
    s = np.asarray(stress, dtype=float)
    if s.shape == (6,):
        return voigt_6_to_full_3x3_stress(s)
    if s.shape in ((9,), (3, 3)):
        return s.reshape(3, 3)
    return None


def frame_labels(frame: RawFrame) -> tuple[float, np.ndarray, np.ndarray | None]:
    """Energy, forces and stress (converted) as floats; raises _Problem if missing or malformed
    (finiteness is checked by check_frames)."""
    n = len(frame.numbers)
    if frame.energy is None:
        raise _Problem("missing energy", "")
    try:
        e = frame.energy  # plain floats skip numpy's ~2 us round trip
        energy = float(e) if isinstance(e, (float, int)) else float(
            np.asarray(e, dtype=float).reshape(()))
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
        if frame.stress_factor != 1.0:
            stress = stress * frame.stress_factor
    return energy, forces, stress


# ---------------------------------------------------------------- checks, in their order


def _owners(parts: Sequence, flat_bad: np.ndarray) -> list[int]:
    """Which of `parts` hold the flagged elements of their flat concatenation."""
    ends = np.cumsum([np.size(p) for p in parts])
    return sorted(set(np.searchsorted(ends, np.flatnonzero(flat_bad), side="right").tolist()))


def _empty(frames: Sequence[RawFrame]) -> dict[int, Problem]:
    return {k: ("empty frame", "no atoms") for k, f in enumerate(frames) if len(f.numbers) == 0}


def _unknown_elements(frames: Sequence[RawFrame]) -> dict[int, Problem]:
    parts = [f.numbers for f in frames]
    numbers = np.concatenate(parts, axis=None)
    if numbers.size == 0 or (numbers.min() >= 1 and numbers.max() <= 118):
        return {}
    found = {}
    for k in _owners(parts, (numbers < 1) | (numbers > 118)):
        z = np.asarray(parts[k])
        bad = (z < 1) | (z > 118)
        found[k] = ("unknown element", f"atomic number {int(z[bad][0])} at atom "
                    f"{int(np.flatnonzero(bad)[0])}")
    return found


def _nonfinite_positions(frames: Sequence[RawFrame]) -> dict[int, Problem]:
    parts = [f.positions for f in frames]
    finite = np.isfinite(np.concatenate(parts, axis=None))
    if finite.all():
        return {}
    return {k: ("non-finite positions", "") for k in _owners(parts, ~finite)}


def _bad_cells(frames: Sequence[RawFrame]) -> dict[int, Problem]:
    """Non-finite cells, and periodic cell vectors that span no volume (area, length).

    Only the periodic vectors must be independent: sqrt(det(Gram)) of the periodic rows is
    their volume (3 periodic), area (2: a slab, whose c vector may be zero) or length (1).
    """
    cells = np.array([f.cell for f in frames], dtype=float).reshape(-1, 3, 3)
    finite = np.isfinite(cells).all(axis=(1, 2))
    found = {k: ("non-finite cell", "") for k in np.flatnonzero(~finite).tolist()}
    pbc = np.array([f.pbc for f in frames], dtype=bool).reshape(-1, 3)
    candidates = np.flatnonzero(pbc.any(axis=1) & finite)
    if candidates.size:
        periodic = pbc[candidates]
        vectors = cells[candidates] * periodic[:, :, None]
        gram = np.einsum("kij,klj->kil", vectors, vectors) + np.eye(3) * ~periodic[:, :, None]
        span = np.sqrt(np.abs(np.linalg.det(gram)))
        singular = ~(span >= MIN_ABS_DET)
        for k, d in zip(candidates[singular].tolist(), span[singular].tolist(), strict=True):
            flags = [bool(p) for p in frames[k].pbc]
            what = {3: "|det(cell)|", 2: "area of the periodic vectors",
                    1: "length of the periodic vector"}[sum(flags)]
            unit = {3: "A^3", 2: "A^2", 1: "A"}[sum(flags)]
            found[k] = ("singular cell with periodic boundaries",
                        f"{what} = {d:.3g} {unit}, pbc = {flags}")
    return found


def _bad_labels(frames: Sequence[RawFrame], limits: Limits = LIMITS) -> dict[int, Problem]:
    """Missing or malformed labels (per frame), then non-finite, then absurd (beyond `limits`)
    energy, forces, stress."""
    found: dict[int, Problem] = {}
    ks, energies, forces, stresses = [], [], [], []
    for k, frame in enumerate(frames):
        try:
            energy, f, s = frame_labels(frame)
        except _Problem as p:
            found[k] = (p.reason, p.detail)
            continue
        ks.append(k)
        energies.append(energy)
        forces.append(f)
        stresses.append(s)
    if not ks:
        return found
    energies_array = np.array(energies)
    for j in np.flatnonzero(~np.isfinite(energies_array)).tolist():
        found[ks[j]] = ("non-finite energy", f"energy = {energies[j]}")
    flat = np.abs(np.concatenate(forces, axis=None))
    finite = np.isfinite(flat)
    if not finite.all():
        for j in _owners(forces, ~finite):
            found.setdefault(ks[j], ("non-finite forces",
                                     f"{int((~np.isfinite(forces[j])).sum())} values"))
    with_stress = [j for j, s in enumerate(stresses) if s is not None]
    if with_stress:
        finite = np.isfinite(np.array([stresses[j] for j in with_stress])).all(axis=(1, 2))
        for i in np.flatnonzero(~finite).tolist():
            found.setdefault(ks[with_stress[i]], ("non-finite stress", ""))
    # absurd values: NaN compares False, so non-finite ones (found above) are not flagged again
    per_atom = np.abs(energies_array) / np.array([len(f) for f in forces])
    for j in np.flatnonzero(per_atom > limits.max_energy_per_atom).tolist():
        found.setdefault(ks[j], ("absurd energy", f"energy = {energies[j]:.6g} eV, "
                                 f"{per_atom[j]:.3g} eV/atom; limit {limits.max_energy_per_atom:g}"
                                 " eV/atom (max_energy_per_atom)"))
    if (flat > limits.max_force).any():
        for j in _owners(forces, flat > limits.max_force):
            atom, axis = np.unravel_index(int(np.nanargmax(np.abs(forces[j]))), forces[j].shape)
            found.setdefault(ks[j], ("absurd forces", f"force {forces[j][atom, axis]:.6g} eV/A "
                                     f"on atom {atom} ({'xyz'[axis]}); limit "
                                     f"{limits.max_force:g} eV/A (max_force)"))
    for j in with_stress:
        peak = np.abs(stresses[j]).max()
        if peak > limits.max_stress:
            found.setdefault(ks[j], ("absurd stress", f"|stress| up to {peak:.6g} eV/A^3; "
                                     f"limit {limits.max_stress:g} eV/A^3 (max_stress)"))
    return found


CHECKS: tuple[Callable[[Sequence[RawFrame]], dict[int, Problem]], ...] = (
    _empty, _unknown_elements, _nonfinite_positions, _bad_cells)


def check_frames(frames: Sequence[RawFrame], check_overlap: bool = True,
                 limits: Limits = LIMITS) -> list[Problem | None]:
    """The first problem (reason, detail) of each frame, or None where it is usable. Pure.

    In order: a reader's problem, empty frame, unknown element (Z outside 1..118, e.g. 'X'),
    non-finite positions, non-finite cell, singular cell with periodic boundaries (periodic
    vectors spanning no volume, area or length), missing or malformed energy / forces /
    stress, non-finite energy / forces / stress, absurd energy / forces / stress (beyond
    `limits`), and with `check_overlap` atoms (or periodic images) closer than MIN_DISTANCE.
    """
    problems: list[Problem | None] = [f.problem for f in frames]
    for check in (*CHECKS, functools.partial(_bad_labels, limits=limits)):
        pending = [k for k, p in enumerate(problems) if p is None]
        if not pending:
            break
        for k, problem in check([frames[k] for k in pending]).items():
            problems[pending[k]] = problem
    if check_overlap:
        for k, frame in enumerate(frames):
            if problems[k] is None:
                problems[k] = _overlap(frame)
    return problems


def check_frame(frame: RawFrame, check_overlap: bool = True,
                limits: Limits = LIMITS) -> Problem | None:
    """(reason, detail) of the first problem of a frame, or None if it is usable."""
    return check_frames([frame], check_overlap, limits)[0]


def _overlap(frame: RawFrame) -> Problem | None:
    """Atoms (or an atom and a periodic image) closer than MIN_DISTANCE."""
    from cfmtrain.frames.neighbors import neighbor_pairs  # lazy: vesin imports torch

    if len(frame.numbers) < 2 and not np.any(frame.pbc):
        return None
    pairs, _, d = neighbor_pairs(np.ascontiguousarray(frame.positions, dtype=float),
                                 np.asarray(frame.cell, dtype=float).reshape(3, 3),
                                 np.asarray(frame.pbc, dtype=bool).reshape(3),
                                 OVERLAP_SEARCH_RADIUS, full=False)
    i, j = pairs[:, 0], pairs[:, 1]
    close = d < MIN_DISTANCE
    if not close.any():
        return None
    i, j, d = i[close], j[close], d[close]
    k = int(np.argmin(d))
    return ("overlapping atoms", f"atoms {int(i[k])} and {int(j[k])} are {d[k]:.4f} A apart, "
            f"minimum {MIN_DISTANCE} A")


# ---------------------------------------------------------------- ase.Atoms front end


def _raw(atoms: Atoms, source: str | os.PathLike, index: int | str,
         keys: dict[str, str | None] | None) -> RawFrame:
    keys = {**KEYS, **keys} if keys else KEYS
    return raw_from_atoms(atoms, str(source), index, keys["energy"], keys["forces"],
                          keys["stress"], keep_info=False)  # checks never read info


def atoms_problems(frames: Sequence[Atoms], source: str | os.PathLike, start: int = 0,
                   keys: dict[str, str | None] | None = None,
                   check_overlap: bool = True, limits: Limits = LIMITS) -> list[Problem | None]:
    """check_frames for labelled ase.Atoms numbered start, start + 1, ... Pure.

    `keys` maps "energy"/"forces"/"stress" to the frames' key names (default MACE's REF_*).
    """
    return check_frames([_raw(a, source, start + k, keys) for k, a in enumerate(frames)],
                        check_overlap, limits)


def atoms_problem(atoms: Atoms, source: str | os.PathLike, index: int | str,
                  keys: dict[str, str | None] | None = None,
                  check_overlap: bool = True, limits: Limits = LIMITS) -> Problem | None:
    """(reason, detail) of the first problem of one labelled frame, or None. Pure."""
    return check_frame(_raw(atoms, source, index, keys), check_overlap, limits)


def frame_message(atoms: Atoms, source: str | os.PathLike, index: int | str,
                  keys: dict[str, str | None] | None = None,
                  check_overlap: bool = True, limits: Limits = LIMITS) -> str | None:
    """None if the frame is usable, else `file: frame i: reason (detail)`. Pure."""
    problem = atoms_problem(atoms, source, index, keys, check_overlap, limits)
    return None if problem is None else format_problem(str(source), index, *problem)


def validate_atoms(atoms: Atoms, source: str | os.PathLike, index: int | str,
                   keys: dict[str, str | None] | None = None,
                   check_overlap: bool = True, limits: Limits = LIMITS) -> None:
    """Return None for a usable frame; raise InvalidFrameError (file, frame, reason) otherwise.

    The checks are check_frames'. `keys` maps "energy"/"forces"/"stress" to key names (default
    REF_*). A caller that builds its own neighbour list may pass `check_overlap=False` and test
    its edge lengths against MIN_DISTANCE. Use `frame_message` for the message as a string.
    """
    problem = atoms_problem(atoms, source, index, keys, check_overlap, limits)
    if problem is not None:
        raise InvalidFrameError(str(source), index, *problem)
