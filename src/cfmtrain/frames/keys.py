"""Labels of own data (`kind: files`): where each label lives in a frame; virial -> stress.

A label is looked up by name in the frame's `info`, its `arrays` and its calculator's results
(ase.io attaches a SinglePointCalculator holding `energy`/`forces`/`stress` when a file has
them). Without a key setting the names tried, in order, are mace-torch's (`REF_energy`,
`REF_forces`, `REF_stress`, `REF_virials`), then ASE's and plain ones (`energy`, `forces`,
`stress`, `virial`), so files written by ASE or by mace-torch need no settings.

A virial W (eV, 3x3, 9 or Voigt 6 values) becomes the stress sigma = -W / V (eV/A^3, V the
cell volume), ASE's sign convention: for EMT atoms, W = -atoms.get_stress(voigt=False) * V.
A stress, when a frame has one, wins over its virial.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from ase import Atoms
from ase.stress import voigt_6_to_full_3x3_stress

from cfmtrain.frames.labels import (
    CONFIG_TYPE_KEY,
    CONFIG_WEIGHT_KEY,
    ENERGY_KEY,
    FORCES_KEY,
    STRESS_KEY,
    VIRIALS_KEY,
)
from cfmtrain.frames.validate import MIN_ABS_DET, RawFrame

FIELDS = ("energy", "forces", "stress", "virial", "weight", "config_type")
DEFAULT_NAMES: dict[str, tuple[str, ...]] = {
    "energy": (ENERGY_KEY, "energy"),
    "forces": (FORCES_KEY, "forces"),
    "stress": (STRESS_KEY, "stress"),
    "virial": (VIRIALS_KEY, "REF_virial", "virials", "virial"),
    "weight": (CONFIG_WEIGHT_KEY,),
    "config_type": (CONFIG_TYPE_KEY,),
}
SCALAR_INFO = (str, int, float, np.integer, np.floating)


@dataclass(frozen=True)
class LabelKeys:
    """For each field, the names tried in order; an empty tuple ignores the field."""

    names: Mapping[str, tuple[str, ...]]

    @classmethod
    def from_mapping(cls, keys: Mapping[str, str | None] | None = None) -> LabelKeys:
        """The defaults, with each field in `keys` replaced by its one name (None: ignored)."""
        keys = dict(keys or {})
        unknown = sorted(set(keys) - set(FIELDS))
        if unknown:
            raise ValueError(f"keys: unknown label(s) {', '.join(unknown)}; known: "
                             f"{', '.join(FIELDS)}")
        names = {f: ((keys[f],) if keys[f] else ()) if f in keys else DEFAULT_NAMES[f]
                 for f in FIELDS}
        return cls(names)

    def as_dict(self) -> dict[str, list[str]]:
        """Plain names per field, for manifests."""
        return {f: list(n) for f, n in self.names.items()}


def _results(atoms: Atoms) -> dict:
    return getattr(atoms.calc, "results", None) or {}


def find(atoms: Atoms, names: tuple[str, ...]) -> tuple[str, object] | None:
    """(name, value) of the first of `names` in info, arrays or calculator results, else None."""
    results = _results(atoms)
    for name in names:
        for place in (atoms.info, atoms.arrays, results):
            if name in place and place[name] is not None:
                return name, place[name]
    return None


def held_keys(atoms: Atoms) -> str:
    """The keys a frame has, per place, for error messages."""
    places = {"info": atoms.info, "arrays": atoms.arrays, "calculator results": _results(atoms)}
    return "; ".join(f"{where}: {', '.join(map(str, p)) or '-'}" for where, p in places.items())


def _missing(field: str, names: tuple[str, ...], atoms: Atoms) -> tuple[str, str]:
    looked = ", ".join(names) if names else "nothing (key set to null)"
    return (f"missing {field}", f"looked for {looked} in info, arrays and calculator results; "
            f"the frame has {held_keys(atoms)}")


def virial_to_stress(virial: object, cell: np.ndarray) -> np.ndarray:
    """sigma = -W / V in ASE's sign convention; raises ValueError on a bad shape or no volume."""
    w = np.asarray(virial, dtype=float)
    if w.shape == (6,):
        w = voigt_6_to_full_3x3_stress(w)
    elif w.shape in ((9,), (3, 3)):
        w = w.reshape(3, 3)
    else:
        raise ValueError(f"shape {w.shape}, expected 3x3, 9 or 6 values")
    volume = abs(float(np.linalg.det(np.asarray(cell, dtype=float))))
    if not volume >= MIN_ABS_DET:
        raise ValueError(f"cell volume {volume:.3g} A^3: a virial needs a cell")
    return -w / volume


def label_info(atoms: Atoms, labels: set[str]) -> dict:
    """The frame's scalar info entries other than `labels`, to be kept in the frames."""
    return {k: v for k, v in atoms.info.items()
            if k not in labels and isinstance(v, SCALAR_INFO)}


def config_type_of(atoms: Atoms, keys: LabelKeys) -> str | None:
    """The frame's own config_type (as a string), or None."""
    found = find(atoms, keys.names["config_type"])
    return None if found is None else str(found[1])


def own_frame(atoms: Atoms, source: str, index: int | str, keys: LabelKeys) -> RawFrame:
    """A RawFrame with the labels under `keys`; a missing or bad label is the frame's problem."""
    frame = RawFrame(source=source, index=index, numbers=atoms.arrays["numbers"],
                     positions=atoms.arrays["positions"], cell=atoms.cell.array, pbc=atoms.pbc)
    found = {f: find(atoms, keys.names[f]) for f in FIELDS}
    for field in ("energy", "forces"):
        if found[field] is None:
            frame.problem = _missing(field, keys.names[field], atoms)
            return frame
    frame.energy, frame.forces = found["energy"][1], found["forces"][1]
    if found["stress"] is not None:
        frame.stress = found["stress"][1]
    elif found["virial"] is not None:
        try:
            frame.stress = virial_to_stress(found["virial"][1], atoms.cell.array)
        except ValueError as err:
            frame.problem = (f"bad virial {found['virial'][0]!r}", str(err))
            return frame
    frame.info = label_info(atoms, {n for names in (*keys.names.values(),
                                                    *DEFAULT_NAMES.values()) for n in names})
    if found["config_type"] is not None:
        frame.info[CONFIG_TYPE_KEY] = str(found["config_type"][1])
    if found["weight"] is not None:
        try:
            frame.info[CONFIG_WEIGHT_KEY] = float(found["weight"][1])  # kept in the frames
        except (TypeError, ValueError) as err:
            frame.problem = (f"bad weight {found['weight'][0]!r}", str(err))
    return frame
