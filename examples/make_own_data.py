"""Write examples/own_data/: a small own-data set in the layout of many DFT exports.

Cu/Ni fcc cells of 4 to 32 atoms, rattled and strained, labelled with ASE's EMT calculator.
The labels sit under names a file written by another code might use: the energy as `energy`
(info), the forces as `force` (arrays), the virial (eV, 3x3) as `virial` (info), and each
frame's `config_type`. A second file holds the isolated Cu and Ni atoms (`config_type`
IsolatedAtom), which give the isolated-atom energies (`e0s: isolated`).

    python examples/make_own_data.py            # rewrites examples/own_data/*.xyz
"""

from __future__ import annotations

import argparse
from pathlib import Path

import ase.io
import numpy as np
from ase import Atoms
from ase.build import bulk
from ase.calculators.emt import EMT

OUT = Path(__file__).resolve().parent / "own_data"


def labelled(atoms: Atoms, config_type: str) -> Atoms:
    """`atoms` without a calculator, its EMT labels under the names this example uses."""
    atoms.calc = EMT()
    energy, forces = atoms.get_potential_energy(), atoms.get_forces()
    virial = None
    if atoms.pbc.all():
        virial = -atoms.get_stress(voigt=False) * atoms.get_volume()
    atoms.calc = None
    atoms.info = {"energy": float(energy), "config_type": config_type}
    if virial is not None:
        atoms.info["virial"] = virial
    atoms.arrays["force"] = forces
    return atoms


def crystals(count: int, seed: int) -> list[Atoms]:
    """`count` rattled Cu/Ni cells, every other one strained by up to 3%."""
    rng = np.random.default_rng(seed)
    frames = []
    for k in range(count):
        repeat = tuple(int(r) for r in rng.integers(1, 3, 3))  # 4 to 32 atoms
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(repeat)
        atoms.numbers[rng.random(len(atoms)) < 0.4] = 28  # Ni
        atoms.rattle(0.05, seed=int(rng.integers(1 << 31)))
        kind = "bulk"
        if k % 2:
            atoms.set_cell(atoms.cell * (1 + rng.uniform(-0.03, 0.03, 3)), scale_atoms=True)
            kind = "strained"
        frames.append(labelled(atoms, kind))
    return frames


def isolated_atoms() -> list[Atoms]:
    """One Cu and one Ni atom alone in an open box."""
    return [labelled(Atoms(symbol, cell=[20, 20, 20], pbc=False), "IsolatedAtom")
            for symbol in ("Cu", "Ni")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=16, help="crystal frames")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=OUT, help="folder written")
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    ase.io.write(args.output / "cuni_emt.xyz", crystals(args.frames, args.seed), format="extxyz")
    ase.io.write(args.output / "isolated_atoms.xyz", isolated_atoms(), format="extxyz")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
