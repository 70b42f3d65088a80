"""`cfmtrain generate`: the embedded `mini` data set, eight subsets mirroring the paper's Table 3
(or, with `--preset crystals`, the MPtrj-like set of cfmtrain.sources.crystals).

Seeded per (seed, subset, frame), labelled by ASE's EMT and TIP3P, written as extxyz shards.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import ase
import numpy as np
from ase import Atoms
from ase.calculators.calculator import all_changes
from ase.calculators.emt import EMT
from ase.calculators.tip3p import TIP3P
from ase.stress import voigt_6_to_full_3x3_stress
from tqdm import tqdm

from cfmtrain import children
from cfmtrain.atomic import atomic_path
from cfmtrain.digest import file_digest
from cfmtrain.frames.extxyz import mace_frame, write_shards
from cfmtrain.frames.labels import CONFIG_TYPE_KEY
from cfmtrain.paper import TABLE3, TABLE3_GRAPHS
from cfmtrain.sources import crystals
from cfmtrain.sources.mini_structures import BUILDERS, TIP3P_RC, closest_contact

GENERATOR_VERSION = "1"
DEFAULT_GRAPHS = 1000  # graphs at scale 1
MIN_CONTACT = 0.9  # Å: the shortest bond a frame may hold (water O-H is 0.957)


@dataclasses.dataclass(frozen=True)
class Subset:
    """One subset of `mini` and the Table 3 row of the paper it stands for."""

    name: str
    paper_name: str
    paper_atoms: tuple[int, int]
    paper_graphs: int
    periodic: bool
    stand_in: bool
    calculator: str
    description: str

    @property
    def share(self) -> float:
        """Fraction of the paper's 2.65M graphs."""
        return self.paper_graphs / TABLE3_GRAPHS


# What `mini` generates for each row of the paper's Table 3 (cfmtrain.paper.TABLE3, whose order
# the subsets follow): (periodic, stand-in chemistry, calculator, description)
_GENERATED: dict[str, tuple[bool, bool, str, str]] = {
    "water_clusters": (False, False, "TIP3P",
        "3-25 rigid TIP3P waters grown into compact clusters by Boltzmann-weighted insertion"),
    "liquid_water": (True, False, "TIP3P",
        "256 rigid TIP3P waters in a periodic cube at 0.97-1.03 g/cm^3 (inserted, not MD)"),
    "cuni": (True, False, "EMT",
        "random fcc Cu-Ni alloys, 5x5x5 cubic cells with 0-8 vacancies, strained, rattled"),
    "hea": (True, True, "EMT",
        "five-element random fcc/bcc alloys of EMT metals (the paper's HEA25 uses other "
        "elements), 36 or 48 atoms"),
    "mptrj": (True, True, "EMT",
        "fcc/bcc/hcp/sc, ordered L1_2/L1_0/B2 and disordered crystals of EMT metals, skewed "
        "and diagonal supercells (log-normal sizes, median 16), strained and rattled"),
    "tmd": (True, True, "EMT",
        "transition-metal dichalcogenides as three-plane EMT-metal sheets (X-M-X) with van "
        "der Waals-like gaps or vacuum"),
    "zeolite": (True, True, "EMT",
        "zeolites as Al/Cu/Ni fcc frameworks with three crossing channels (22-38% of the "
        "sites removed)"),
    "al_hcl": (True, True, "EMT+TIP3P",
        "Al in HCl(aq) as an Al(100) slab (EMT) under 52 TIP3P waters, labelled as two "
        "non-interacting subsystems; no Cl or hydronium"),
}
SUBSETS: dict[str, Subset] = {
    row.key: Subset(row.key, row.name, row.atoms, row.graphs, *_GENERATED[row.key])
    for row in TABLE3}


def subset_counts(scale: float = 1.0) -> dict[str, int]:
    """Frames per subset: the paper's proportions of `DEFAULT_GRAPHS * scale`, at least one."""
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive number, got {scale}")
    return {name: max(1, int(np.floor(DEFAULT_GRAPHS * scale * s.share + 0.5)))
            for name, s in SUBSETS.items()}


def generation_order(counts: dict[str, int]) -> list[tuple[str, int]]:
    """(subset, frame index) pairs, subset by subset, so round-robin shards split each evenly."""
    return [(name, i) for name in SUBSETS for i in range(counts[name])]


def reference_labels(atoms: Atoms) -> tuple[float, np.ndarray, np.ndarray | None]:
    """Energy (eV), forces (eV/Å) and 3x3 stress (eV/Å^3, or None) from EMT and TIP3P.

    Water (H, O; ordered O,H,H per molecule) goes to TIP3P, everything else to EMT; a mixed
    frame is the sum of the two subsystems evaluated separately. Stress only from EMT alone.
    """
    water = np.isin(atoms.numbers, (1, 8))
    with_stress = not water.any() and bool(atoms.pbc.all())
    energy, forces, stress = 0.0, np.zeros((len(atoms), 3)), None
    for mask, calc in ((~water, EMT()), (water, TIP3P(rc=TIP3P_RC))):
        if mask.any():
            props = ["energy", "forces"] + (["stress"] if with_stress else [])
            calc.calculate(atoms[mask], props, all_changes)  # one evaluation for all properties
            energy += calc.results["energy"]
            forces[mask] = calc.results["forces"]
            if with_stress:
                stress = voigt_6_to_full_3x3_stress(calc.results["stress"])
    return float(energy), forces, stress


def make_frame(seed: int, name: str, index: int) -> Atoms:
    """Frame `index` of subset `name`: built from its own random stream, then labelled."""
    stream = [seed, list(SUBSETS).index(name), index]
    try:
        atoms = BUILDERS[name](np.random.default_rng(stream), index)
    except RuntimeError as err:
        raise RuntimeError(f"mini/{name} frame {index} (seed {seed}): {err}") from err
    atoms.positions = np.round(atoms.positions, 8)  # as written to extxyz: labels match the file
    contact = closest_contact(atoms, MIN_CONTACT)
    if contact < MIN_CONTACT:
        raise RuntimeError(f"mini/{name} frame {index}: atoms {contact:.3f} Å apart")
    energy, forces, stress = reference_labels(atoms)
    return mace_frame(atoms, energy, forces, stress, config_type=name)


def _make_task(task: tuple[int, str, int]) -> Atoms:
    return make_frame(*task)


def _check_seed(seed: int) -> None:
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")


def iter_mini_frames(
    scale: float = 1.0, seed: int = 0, workers: int = 1, progress: bool = False
) -> Iterator[Atoms]:
    """Yield the labelled frames of `mini` in generation order (identical for any `workers`)."""
    _check_seed(seed)
    tasks = [(int(seed), name, i) for name, i in generation_order(subset_counts(scale))]
    bar = tqdm(total=len(tasks), desc="mini", unit="frame", disable=not progress)
    with bar:
        if workers <= 1:
            for task in tasks:
                yield _make_task(task)
                bar.update()
            return
        with children.pool(workers) as pool:
            for frame in pool.imap(_make_task, tasks, chunksize=2):
                yield frame
                bar.update()


def generate_mini(
    output_dir: str | Path, scale: float = 1.0, seed: int = 0, num_shards: int = 2,
    workers: int = 1, progress: bool = False,
) -> dict:
    """Write `mini` as `frames_XXXX.extxyz` shards plus `manifest.json` (last); return it."""
    if int(num_shards) != num_shards or num_shards < 1:
        raise ValueError(f"num_shards must be a positive integer, got {num_shards}")
    _check_seed(seed)
    subset_counts(scale)  # checks the scale
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)  # never a manifest beside other shards
    paths = [out / f"frames_{k:04d}.extxyz" for k in range(int(num_shards))]
    per_subset: Counter[str] = Counter()

    def counted() -> Iterator[Atoms]:
        with contextlib.closing(iter_mini_frames(scale, seed, workers, progress)) as frames:
            for frame in frames:
                per_subset[frame.info[CONFIG_TYPE_KEY]] += 1
                yield frame

    # closed here, not when collected: a stop while a shard is written (Ctrl-C, a full disk)
    # ends the pool and the progress bar's line before the command says why it stopped
    with contextlib.closing(counted()) as frames:
        counts = write_shards(frames, paths)
    shards = [{"file": p.name, "frames": n, "sha256": file_digest(p)}
              for p, n in zip(paths, counts, strict=True)]
    manifest = {
        "dataset": "mini", "generator_version": GENERATOR_VERSION, "ase_version": ase.__version__,
        "seed": int(seed), "scale": float(scale), "num_shards": len(paths),
        "total_frames": sum(per_subset.values()), "shards": shards,
        "frames_per_subset": {name: per_subset[name] for name in SUBSETS},
        "subsets": {name: dataclasses.asdict(s) | {"share": s.share}
                    for name, s in SUBSETS.items()},
    }
    with atomic_path(out / "manifest.json") as tmp:
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain generate`."""
    parser.add_argument("--output-dir", required=True, type=Path, help="folder for the shards")
    parser.add_argument("--num-shards", type=int, default=2, help="extxyz files (default 2)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help=f"multiplies the frame counts (1 = about {DEFAULT_GRAPHS} graphs)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--preset", choices=("mini", crystals.PRESET), default="mini",
                        help="mini: the eight subsets of Table 3 (EMT, TIP3P); crystals: an "
                        "MPtrj-like set of --graphs periodic crystals (Morse labels)")
    parser.add_argument("--graphs", type=int, help="frames of the crystals preset")


def run(args: argparse.Namespace) -> int:
    """Generate the preset's frames and print one line per shard."""
    try:
        if args.preset == crystals.PRESET:
            if args.graphs is None:
                raise ValueError("the crystals preset needs --graphs (its number of frames)")
            manifest = crystals.generate_crystals(args.output_dir, args.graphs, args.seed,
                                                  args.num_shards, args.workers)
        elif args.graphs is not None:
            raise ValueError("--graphs is for the crystals preset; mini's size is --scale")
        else:
            manifest = generate_mini(args.output_dir, args.scale, args.seed, args.num_shards,
                                     args.workers, progress=True)
    except ValueError as err:
        print(f"cfmtrain generate: {err}", file=sys.stderr)
        return 2
    for shard in manifest["shards"]:
        print(f"{args.output_dir / shard['file']}: {shard['frames']} frames")
    print(f"{args.preset}: {manifest['total_frames']} frames, seed {manifest['seed']}"
          + (f", scale {manifest['scale']}" if "scale" in manifest else "")
          + f": {manifest['frames_per_subset']}")
    return 0
