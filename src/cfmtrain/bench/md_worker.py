"""One configuration of `cfmtrain bench md`, run inside its own subprocess.

A MACE model shaped like a public foundation model (random weights, seed 0: the timing depends
on the shape, not the weights) drives velocity-Verlet MD at 1 fs through mace-torch's own
`MACECalculator`, as a user runs it; `fused` swaps cfmtrain's kernels into the calculator's model
first. `symmetrix` runs the same model converted by Symmetrix-XL's own converter
(`symmetrix_extract_mace`, the `convert` configuration) through its ASE calculator, an
inference engine of its own (optional: `pip install .[peers]`). Prints one JSON line: seconds
per MD step (each step is one call with its neighbour list), and the energy and forces of the
first call to compare implementations.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
import traceback

import mace  # noqa: F401  (before e3nn)
import numpy as np
import torch

from cfmtrain.bench import WARMUP_CALLS
from cfmtrain.paper import CUTOFF

# MACE-MP-0's hyper-parameters (mace-torch's `mace_mp` models, 89 elements); "small" and
# "medium" differ in their hidden irreps. "tiny" keeps the structure at a size that tests run.
MP0 = {"r_max": 6.0, "num_bessel": 10, "num_polynomial_cutoff": 5, "max_ell": 3,
       "correlation": 3, "num_interactions": 2, "mlp_irreps": "16x0e",
       "radial_mlp": [64, 64, 64], "avg_num_neighbors": 61.96, "elements": 89}
SHAPES = {
    "mp0-small": {**MP0, "hidden_irreps": "128x0e"},
    "mp0-medium": {**MP0, "hidden_irreps": "128x0e+128x1o"},
    # l_max 3 and correlation 3 as MP-0 (Symmetrix-XL converts no other), at a size tests run
    "tiny": {**MP0, "hidden_irreps": "8x0e+8x1o", "radial_mlp": [16], "r_max": CUTOFF,
             "elements": 29},
}
PEERS_EXTRA = "pip install .[peers]"
OOM_MARKERS = ("can't allocate memory", "not enough memory", "out of memory", "std::bad_alloc")
WATER_DENSITY_G_CM3 = 1.0
TIMESTEP_FS = 1.0


def build_shape(shape: str, dtype: torch.dtype) -> torch.nn.Module:
    """A ScaleShiftMACE with the hyper-parameters of SHAPES[shape], seeded initial weights."""
    from e3nn import o3
    from mace import modules

    s = SHAPES[shape]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    torch.manual_seed(0)
    try:
        block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
        return modules.ScaleShiftMACE(
            r_max=s["r_max"], num_bessel=s["num_bessel"],
            num_polynomial_cutoff=s["num_polynomial_cutoff"], max_ell=s["max_ell"],
            interaction_cls=block, interaction_cls_first=block,
            num_interactions=s["num_interactions"], num_elements=s["elements"],
            hidden_irreps=o3.Irreps(s["hidden_irreps"]), MLP_irreps=o3.Irreps(s["mlp_irreps"]),
            atomic_energies=np.zeros(s["elements"]), avg_num_neighbors=s["avg_num_neighbors"],
            atomic_numbers=list(range(1, s["elements"] + 1)), correlation=s["correlation"],
            gate=torch.nn.functional.silu, radial_MLP=s["radial_mlp"],
            atomic_inter_scale=1.0, atomic_inter_shift=0.0).to(dtype)
    finally:
        torch.set_default_dtype(previous)


def fcc_alloy(target_atoms: int, seed: int = 0):
    """A rattled fcc Cu supercell (n x n x m cubic cells, 4 atoms each) of about
    `target_atoms`, 20% Ni at random."""
    import ase.build

    n = max(1, round((target_atoms / 4) ** (1 / 3)))
    m = max(1, round(target_atoms / (4 * n * n)))
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True) * (n, n, m)
    rng = np.random.default_rng(seed)
    atoms.numbers[rng.random(len(atoms)) < 0.2] = 28
    atoms.rattle(0.05, seed=seed)
    return atoms


def water_box(target_atoms: int, seed: int = 0):
    """A periodic cubic box of k^3 randomly oriented H2O molecules (about `target_atoms`
    atoms) on a simple cubic lattice at 1 g/cm^3."""
    import ase
    import ase.build
    from scipy.spatial.transform import Rotation

    k = max(1, round((target_atoms / 3) ** (1 / 3)))
    molecule = ase.build.molecule("H2O")
    mass_g = molecule.get_masses().sum() / 6.02214076e23
    spacing = (mass_g / WATER_DENSITY_G_CM3 * 1e24) ** (1 / 3)  # Å per molecule
    template = molecule.positions - molecule.get_center_of_mass()
    grid = spacing * np.stack(np.meshgrid(*[np.arange(k)] * 3, indexing="ij"), -1).reshape(-1, 3)
    rotations = Rotation.random(len(grid), random_state=seed).as_matrix()
    positions = grid[:, None, :] + np.einsum("mij,aj->mai", rotations, template)
    return ase.Atoms(np.tile(molecule.numbers, len(grid)), positions=positions.reshape(-1, 3),
                     cell=[k * spacing] * 3, pbc=True)


SYSTEMS = {"fcc": fcc_alloy, "water": water_box}


def probe(size: int) -> np.ndarray:
    """A fixed (seeded) random unit vector: two implementations' forces projected on it agree
    to their error, without passing every force between processes."""
    vector = np.random.default_rng(12345).standard_normal(size)
    return vector / np.linalg.norm(vector)


def symmetrix_missing() -> str | None:
    """Why the `symmetrix` arm cannot run here, or None when it can: Symmetrix-XL and one of
    its native backends are installed (found without importing either)."""
    import importlib.util

    if importlib.util.find_spec("symmetrix") is None:
        return f"not installed ({PEERS_EXTRA})"
    import symmetrix

    if not symmetrix.available_backends():
        return f"no native backend installed ({PEERS_EXTRA})"
    return None


def convert(config: dict) -> dict:
    """The `convert` configuration: the model of `config["shape"]` (built in `config["dtype"]`,
    as every arm builds it) saved to `config["work"]`, then converted by Symmetrix-XL's own
    command, `symmetrix_extract_mace`; the JSON's path and the conversion's seconds."""
    import subprocess
    import sys
    from pathlib import Path

    work = Path(config["work"])
    model_path = work / f"{config['shape']}_{config['dtype']}.model"
    torch.save(build_shape(config["shape"], getattr(torch, config["dtype"])), model_path)
    output = model_path.with_suffix(".json")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "symmetrix.cli.extract_mace", "--model",
                           str(model_path), "--output", str(output)],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return {"status": f"error: symmetrix_extract_mace: {tail[:200]}"}
    return {"status": "ok", "symmetrix_model": str(output), "convert_s": seconds}


def symmetrix_calculator(config: dict):
    """Symmetrix-XL's ASE calculator of the converted model in `config["dtype"]` on
    `config["threads"]` OpenMP threads (its Kokkos runtime reads them when it loads); its JIT
    cache in `config["jit_cache"]` when given (a fresh one times the compile); (calculator,
    backend)."""
    os.environ["OMP_NUM_THREADS"] = str(config["threads"])
    if config.get("jit_cache"):
        os.environ["SYMMETRIX_JIT_CACHE"] = config["jit_cache"]
    import symmetrix  # lazy: an optional peer

    calc = symmetrix.Symmetrix(config["symmetrix_model"], dtype=config["dtype"])
    return calc, f"symmetrix {symmetrix.__version__} {symmetrix.selected_backend()['selector']}"


def md_run(config: dict, impl: str):
    """The system of `config` with a calculator of the `impl` model ("mace", "fused": cfmtrain's
    kernels swapped in, both in a MACECalculator, or "symmetrix": Symmetrix-XL's calculator of
    the converted model), at 300 K: (atoms, its VelocityVerlet, the backend)."""
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet
    from ase.units import fs
    from mace.calculators import MACECalculator

    atoms = SYSTEMS[config["system"]](config["atoms"])
    if impl == "symmetrix":
        atoms.calc, backend = symmetrix_calculator(config)
    else:
        model = build_shape(config["shape"], getattr(torch, config["dtype"]))
        backend = "mace"
        if impl == "fused":
            # lazy: only fused runs load cfmtrain's op libraries
            from cfmtrain.kernels import fuse_model, kernel_backend

            fuse_model(model)
            backend = "+".join(sorted(set(kernel_backend(model).values())))
        atoms.calc = MACECalculator(models=[model], device="cpu", default_dtype=config["dtype"])
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(0))
    return atoms, VelocityVerlet(atoms, timestep=TIMESTEP_FS * fs), backend


def _md_step(dyn) -> None:
    """One MD step, timed by the caller (ASE's run returns a bool, not a time)."""
    dyn.run(1)


def paired_ratios(rounds, candidate: str = "fused") -> dict[str, dict]:
    """Per other arm of `rounds` (a measure.paired.Rounds): `candidate`'s paired speed-up over
    it (its time over the candidate's, per round) as the PAIRED columns."""
    return {arm: rounds.ratio(arm, candidate).columns() for arm in rounds.names
            if arm != candidate}


def run_paired(config: dict) -> dict:
    """The implementations `config["arms"]` (default mace and fused) in this process,
    `WARMUP_CALLS` MD steps each untimed, then `rounds` paired rounds of one step each
    (shuffled order): the fused model's speed-up over each other arm, per round."""
    from cfmtrain.measure.paired import run_rounds

    torch.set_num_threads(config["threads"])
    dyns = {impl: md_run(config, impl)[1] for impl in config.get("arms", ("mace", "fused"))}
    for dyn in dyns.values():
        dyn.run(WARMUP_CALLS)
    rounds = run_rounds({impl: functools.partial(_md_step, dyn) for impl, dyn in dyns.items()},
                        config["rounds"])
    return {"status": "ok", "ratios": paired_ratios(rounds)}


def run_md(config: dict) -> dict:
    """Build the model and system, take the first energy and forces, run `WARMUP_CALLS` MD
    steps untimed, then time `steps` more."""
    if config["impl"] == "paired":
        return run_paired(config)
    if config["impl"] == "convert":
        return convert(config)
    torch.set_num_threads(config["threads"])
    start = time.perf_counter()
    atoms, dyn, backend = md_run(config, config["impl"])
    setup_s = time.perf_counter() - start
    start = time.perf_counter()
    energy, forces = atoms.get_potential_energy(), atoms.get_forces()
    first_s = time.perf_counter() - start
    dyn.run(WARMUP_CALLS)
    wall, cpu = [], []
    for _ in range(config["steps"]):
        w, c = time.perf_counter(), time.process_time()
        dyn.run(1)
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    if not np.isfinite(atoms.get_potential_energy()):
        raise FloatingPointError("the MD trajectory reached a non-finite energy")
    median = statistics.median(wall)
    return {"status": "ok", "atoms": len(atoms), "median_step_s": median, "min_step_s": min(wall),
            "max_step_s": max(wall), "median_cpu_s": statistics.median(cpu),
            "us_per_atom": median / len(atoms) * 1e6, "setup_s": setup_s,
            "first_call_s": first_s, "steps_per_s": 1.0 / median,
            "ns_per_day": 86400.0 / median * TIMESTEP_FS * 1e-6,
            "energy": float(energy), "forces_norm": float(np.linalg.norm(forces)),
            "forces_probe": float(forces.ravel() @ probe(forces.size)), "backend": backend,
            "threads": torch.get_num_threads()}


def main(config: dict) -> int:
    """Run one configuration and print its JSON line (an error line if it failed)."""
    try:
        result = run_md(config)
    except Exception as err:  # noqa: BLE001  (recorded in the row, the bench goes on)
        traceback.print_exc()
        oom = isinstance(err, MemoryError) or any(m in str(err) for m in OOM_MARKERS)
        result = {"status": "oom" if oom else f"error: {type(err).__name__}: {str(err)[:200]}"}
    result.update(omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
                  openblas_threads=os.environ.get("OPENBLAS_NUM_THREADS"))
    print(json.dumps(result), flush=True)
    return 0
