"""`cfmtrain graphs`: frames of one extxyz shard -> radius graphs -> one HDF5 graph shard.

Frames are validated first; a bad frame is an error naming file, frame and reason, or with
--skip-invalid it is skipped and counted in a JSON report beside the shard.
"""

from __future__ import annotations

import argparse
import collections
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import ase.io
import numpy as np
from ase import Atoms
from ase.stress import voigt_6_to_full_3x3_stress
from tqdm import tqdm

from cfmtrain.atomic import atomic_path
from cfmtrain.graphs.neighbors import radius_graph
from cfmtrain.graphs.store import write_shard

KEYS = {"energy": "REF_energy", "forces": "REF_forces", "stress": "REF_stress"}


def atoms_to_graph(atoms: Atoms, cutoff: float, keys: dict[str, str] = KEYS) -> dict:
    """One labelled structure as a graph dict in GraphStore's fields (without validation)."""
    graph = radius_graph(atoms.positions, atoms.cell.array, atoms.pbc, cutoff)
    stress = atoms.info.get(keys["stress"])
    if stress is not None:
        stress = np.asarray(stress, dtype=np.float64)
        stress = voigt_6_to_full_3x3_stress(stress) if stress.size == 6 else stress.reshape(3, 3)
    return {
        "positions": atoms.positions, "numbers": atoms.numbers, "cell": atoms.cell.array,
        "pbc": atoms.pbc, "edge_index": graph.edge_index, "unit_shifts": graph.unit_shifts,
        "energy": float(atoms.info[keys["energy"]]), "forces": atoms.arrays[keys["forces"]],
        "stress": stress, "subset": str(atoms.info.get("config_type", "default")),
        "min_length": graph.min_length,
    }


def build_graphs(frames: Iterable[Atoms], source: str, cutoff: float, skip_invalid: bool,
                 skipped: collections.Counter, keys: dict[str, str] = KEYS) -> Iterator[dict]:
    """Validate and convert frames; invalid ones raise or, with skip_invalid, are counted."""
    from cfmtrain.data.convert import MIN_DISTANCE, InvalidFrameError, validate_atoms

    for index, atoms in enumerate(frames):
        try:
            # the overlap check reuses the radius graph's shortest edge instead of a second search
            validate_atoms(atoms, source, index, keys=keys, check_overlap=False)
            graph = atoms_to_graph(atoms, cutoff, keys)
            if graph.pop("min_length") < MIN_DISTANCE:
                raise InvalidFrameError(source, index, "overlapping atoms",
                                        f"two atoms closer than {MIN_DISTANCE} A")
        except InvalidFrameError as err:
            if not skip_invalid:
                raise
            skipped[err.reason] += 1
            continue
        graph["source_index"] = index
        yield graph


def build_shard(source: Path, output: Path, cutoff: float, skip_invalid: bool = False) -> dict:
    """Build one HDF5 shard from one extxyz file; returns the report (graphs, skipped by reason)."""
    skipped: collections.Counter = collections.Counter()
    frames = tqdm(ase.io.iread(source, index=":", format="extxyz"), desc=f"graphs {source.name}",
                  unit="frame", mininterval=2.0)
    count = write_shard(output, build_graphs(frames, str(source), cutoff, skip_invalid, skipped),
                        cutoff=cutoff, attrs={"source": str(source)})
    return {"source": str(source), "output": str(output), "cutoff": cutoff, "graphs": count,
            "skipped": sum(skipped.values()), "skipped_by_reason": dict(skipped)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain graphs`."""
    parser.add_argument("--input", type=Path, required=True, help="extxyz shard of frames")
    parser.add_argument("--output", type=Path, required=True, help="HDF5 graph shard to write")
    parser.add_argument("--cutoff", type=float, default=4.5, help="radius cutoff in Å")
    parser.add_argument("--skip-invalid", action="store_true", help="skip and count bad frames")
    parser.add_argument("--report", type=Path, help="JSON report (default: <output>.json)")


def run(args: argparse.Namespace) -> int:
    """Build the shard and write its report."""
    report = build_shard(args.input, args.output, args.cutoff, args.skip_invalid)
    with atomic_path(args.report or args.output.with_suffix(".json")) as tmp:
        tmp.write_text(json.dumps(report, indent=2))
    print(f"{args.output}: {report['graphs']} graphs, {report['skipped']} skipped")
    return 0
