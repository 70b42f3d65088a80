"""NVT molecular dynamics with a trained model: mace-torch's MACECalculator in ASE, the Bussi
thermostat, cfmtrain's fused kernels swapped into the model for speed (docs/tutorial.md).

    python examples/md_nvt.py --model results/model/cuni/best.model --steps 200

The model file is an ordinary mace-torch model: `--kernels mace` runs it without cfmtrain (the
script then imports nothing of cfmtrain), as any MACE user would. The start is the first
structure of `--structure`, repeated `--repeat` times along each cell vector; the trajectory is
written every `--interval` steps (ASE's .traj: `ase gui results/md/nvt.traj` shows it), and a
line of time, energies and temperature printed as it goes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import ase.io
import numpy as np
import torch
from ase import units
from ase.io.trajectory import Trajectory
from ase.md import MDLogger
from ase.md.bussi import Bussi
from ase.md.velocitydistribution import Stationary
from mace.calculators import MACECalculator

try:
    from ase.md.velocitydistribution import thermalize_momenta
except ImportError:  # ASE before 3.29
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution as thermalize_momenta


def load(path: Path, dtype: str, kernels: str) -> torch.nn.Module:
    """The model of `path` in `dtype`, with cfmtrain's fused kernels swapped in unless
    `kernels` is "mace" (its parameters are shared, not changed: the same model, faster)."""
    model = torch.load(path, map_location="cpu", weights_only=False)  # a pickle: trusted files
    model = model.double() if dtype == "float64" else model.float()
    if kernels == "fused":
        from cfmtrain.kernels import fuse_model

        fuse_model(model)
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("results/model/cuni/best.model"))
    parser.add_argument("--structure", type=Path,
                        default=Path("examples/own_data/cuni_emt.xyz"),
                        help="a file ASE reads; its first structure is the start")
    parser.add_argument("--repeat", type=int, default=2, help="supercell along each vector")
    parser.add_argument("--temperature", type=float, default=600.0, help="K")
    parser.add_argument("--timestep", type=float, default=2.0, help="fs")
    parser.add_argument("--taut", type=float, default=100.0, help="the thermostat's time, fs")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--interval", type=int, default=10, help="steps between frames/lines")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="float64 keeps the energy conserved to the step's accuracy")
    parser.add_argument("--kernels", choices=("fused", "mace"), default="fused",
                        help="fused: cfmtrain's kernels; mace: mace-torch's own code")
    parser.add_argument("--trajectory", type=Path, default=Path("results/md/nvt.traj"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    atoms = ase.io.read(args.structure, index=0)
    atoms = atoms.repeat(args.repeat) if atoms.pbc.any() else atoms
    atoms.calc = MACECalculator(models=[load(args.model, args.dtype, args.kernels)],
                                device="cpu", default_dtype=args.dtype)
    rng = np.random.default_rng(args.seed)
    thermalize_momenta(atoms, temperature_K=args.temperature, rng=rng)
    Stationary(atoms)
    dyn = Bussi(atoms, timestep=args.timestep * units.fs, temperature_K=args.temperature,
                taut=args.taut * units.fs, rng=rng)
    args.trajectory.parent.mkdir(parents=True, exist_ok=True)
    trajectory = Trajectory(args.trajectory, "w", atoms)  # positions, energies, forces
    dyn.attach(trajectory.write, interval=args.interval)
    dyn.attach(MDLogger(dyn, atoms, "-", header=True, peratom=True), interval=args.interval)
    temperatures = []
    dyn.attach(lambda: temperatures.append(atoms.get_temperature()), interval=1)
    atoms.get_potential_energy()  # the first call builds the model's code: not timed
    start = time.perf_counter()
    dyn.run(args.steps)
    seconds = time.perf_counter() - start
    trajectory.close()
    late = temperatures[len(temperatures) // 2:]
    print(f"{len(atoms)} atoms, {args.steps} steps of {args.timestep:g} fs in {seconds:.1f} s "
          f"({1000 * seconds / max(args.steps, 1):.0f} ms a step, {args.kernels} kernels); "
          f"mean temperature over the second half {np.mean(late):.0f} K "
          f"(target {args.temperature:g} K); trajectory: {args.trajectory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
