"""How a data set's files hold their labels (the keys and the stress unit), the part of a file
one task reads, and the frame that stands for one that could not be read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ase import units

from cfmtrain.frames.labels import ENERGY_KEY, FORCES_KEY, STRESS_KEY
from cfmtrain.frames.validate import Problem, RawFrame

# Factor from the source's unit/sign convention to eV/A^3 in ASE's sign convention
# (positive = tensile; VASP reports compressive stress as positive, hence the minus).
STRESS_UNITS: dict[str, float] = {
    "eV/A^3": 1.0,
    "GPa": units.GPa,
    "kBar": 0.1 * units.GPa,
    "GPa-vasp": -units.GPa,
    "kBar-vasp": -0.1 * units.GPa,
}
@dataclass(frozen=True)
class ReadOptions:
    """Which keys hold the labels in the source files, and the stress unit."""

    energy_key: str = ENERGY_KEY
    forces_key: str = FORCES_KEY
    stress_key: str | None = STRESS_KEY
    stress_unit: str = "eV/A^3"

    @property
    def stress_factor(self) -> float:
        try:
            return STRESS_UNITS[self.stress_unit]
        except KeyError:
            raise ValueError(f"unknown stress unit {self.stress_unit!r}; "
                             f"known: {', '.join(STRESS_UNITS)}") from None


@dataclass(frozen=True)
class Part:
    """Frames of one input file read as one task: all of them, or `count` frames from frame
    `first` of an extxyz file (at byte `offset`, after `line` lines; frames.extxyz.frame_offsets
    finds them)."""

    path: Path
    first: int = 0
    offset: int = 0
    line: int = 0
    count: int | None = None


def problem_frame(source: str, index: int | str, problem: Problem) -> RawFrame:
    """A frame that could not be read: it carries the reader's problem and no atoms."""
    return RawFrame(source, index, np.zeros(0, int), np.zeros((0, 3)), np.zeros((3, 3)),
                    np.zeros(3, bool), problem=problem)
