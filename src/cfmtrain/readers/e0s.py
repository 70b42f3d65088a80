"""Isolated-atom energies (E0s) of one's own data set, as its config `e0s` gives them.

`fit` (least squares over the training split, at training time) and `average` (mace-torch's)
leave them to training. Given values come from a mapping element -> eV, from a file of
isolated-atom frames, or from the data's own frames marked `config_type=IsolatedAtom` or
`isolated_atom` (as mace-torch reads them; such frames are never trained on). Given values are
written to the frames folder as `e0s.json`, a mapping element -> eV that training reads as
config `model.e0s`; the method and source go to the frames manifest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from ase import Atoms
from ase.data import atomic_numbers, chemical_symbols

from cfmtrain.atomic import atomic_path
from cfmtrain.frames.keys import LabelKeys, find, held_keys
from cfmtrain.frames.validate import InvalidFrameError

TRAINING_METHODS = ("fit", "average")  # computed by training, nothing written here
E0S_FILE = "e0s.json"
Located = tuple[str, int | str, Atoms]  # (source file, frame, atoms)


@dataclass(frozen=True)
class E0s:
    """Method (fit, average, mapping, isolated, file), values (element -> eV) and source."""

    method: str
    values: dict[str, float] = field(default_factory=dict)
    source: str = ""

    def record(self) -> dict:
        """The manifest's entry."""
        return {"method": self.method, "values": self.values, "source": self.source}


def isolated_energies(frames: Iterable[Located], keys: LabelKeys) -> dict[str, float]:
    """Element -> energy of single-atom frames; an error names the file and frame of a frame
    with several atoms, without an energy, or disagreeing with an earlier one of its element."""
    values: dict[str, float] = {}
    seen: dict[str, str] = {}
    for source, index, atoms in frames:
        if len(atoms) != 1:
            raise InvalidFrameError(source, index, "isolated-atom frame with several atoms",
                                    f"{len(atoms)} atoms; E0s come from single atoms")
        found = find(atoms, keys.names["energy"])
        if found is None:
            raise InvalidFrameError(source, index, "missing energy", f"looked for "
                                    f"{', '.join(keys.names['energy'])}; the frame has "
                                    f"{held_keys(atoms)}")
        symbol, energy = atoms.get_chemical_symbols()[0], float(found[1])
        if symbol in values and not np.isclose(values[symbol], energy, rtol=0, atol=1e-6):
            raise InvalidFrameError(source, index, f"second isolated {symbol}",
                                    f"{energy} eV, but {seen[symbol]} gave {values[symbol]} eV")
        values[symbol], seen[symbol] = energy, f"{source}: frame {index}"
    return values


def mapping_e0s(mapping: Mapping[str, object], source: str) -> dict[str, float]:
    """Element symbol -> finite eV, checked."""
    values = {}
    for key, value in mapping.items():
        if str(key) not in atomic_numbers or isinstance(value, bool) or not isinstance(
                value, int | float) or not np.isfinite(value):
            raise ValueError(f"{source}: e0s entry {key!r}: {value!r} is not an element symbol "
                             "and a finite energy in eV")
        values[str(key)] = float(value)
    return values


def resolve_e0s(spec: str, marked: list[Located], keys: LabelKeys,
                read_file: Callable[[Path], Iterable[Located]]) -> E0s:
    """The E0s of `spec`: fit, average, isolated (the `marked` frames), a JSON mapping, or a
    file of isolated-atom frames (read by `read_file(path)` into Located frames)."""
    if spec in TRAINING_METHODS:
        return E0s(spec)
    if spec == "isolated":
        if not marked:
            raise ValueError("e0s: isolated, but no frame of the data has config_type "
                             "IsolatedAtom or isolated_atom")
        sources = sorted({source for source, _, _ in marked})
        return E0s("isolated", isolated_energies(marked, keys), ", ".join(sources))
    if spec.lstrip().startswith("{"):
        try:
            mapping = json.loads(spec)
        except json.JSONDecodeError as err:
            raise ValueError(f"e0s: {spec!r} is not a JSON mapping: {err}") from None
        return E0s("mapping", mapping_e0s(mapping, "e0s"), "config")
    path = Path(spec)
    if path.is_dir():
        raise ValueError(f"e0s file {spec}: is a folder, not a file of isolated-atom frames")
    if not path.is_file():
        if path.suffix or os.sep in spec:  # meant as a file
            raise ValueError(f"e0s file {spec}: no such file (the isolated-atom frames to read "
                             "the E0s from)")
        raise ValueError(f"e0s: {spec!r} is neither fit, average, isolated, a mapping nor a "
                         "file of isolated-atom frames")
    return E0s("file", isolated_energies(read_file(path), keys), str(path))


def check_covers(e0s: E0s, numbers: Iterable[int]) -> None:
    """Given E0s must cover every element of the data; raises ValueError naming the missing."""
    if e0s.method in TRAINING_METHODS:
        return
    missing = [chemical_symbols[z] for z in sorted(set(numbers))
               if chemical_symbols[z] not in e0s.values]
    if missing:
        raise ValueError(f"e0s ({e0s.method}, {e0s.source}): no E0 for {', '.join(missing)} "
                         f"(elements of the data; given: {', '.join(sorted(e0s.values))})")


def write_e0s(output_dir: str | os.PathLike, e0s: E0s) -> Path | None:
    """Write given values as `e0s.json` (element -> eV) atomically; None for fit/average."""
    path = Path(output_dir) / E0S_FILE
    path.unlink(missing_ok=True)
    if e0s.method in TRAINING_METHODS:
        return None
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(e0s.values, indent=2) + "\n")
    return path
