"""Stream the MPtrj JSON, gzipped or not (11 GB: never json.load it), without importing pymatgen.

Schema (figshare item 23713842, MPtrj_2022.9_full.json): {mp-id: {frame-id: record}}, a record
holding a pymatgen `structure` dict, `uncorrected_total_energy`, `corrected_total_energy` (eV),
`force` (eV/A), `stress` (kBar, VASP sign), `magmom`, `mp_id` and per-atom/relaxed energies.
"""

from __future__ import annotations

import gzip
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from ase import Atoms
from ase.calculators.singlepoint import SinglePointCalculator
from ase.data import atomic_numbers

from cfmtrain.frames.validate import RawFrame
from cfmtrain.readers.options import Part, ReadOptions, problem_frame
from cfmtrain.readers.read import Read

# Energy: MACE-MP-0 was trained on extxyz files whose `energy` is `uncorrected_total_energy`
# (Matbench Discovery, models/mace/json_to_extxyz.py by Y. Chiang: atoms.info["energy"] =
# uncorrected_total_energy); `corrected_total_energy` adds the MP2020 corrections (CHGNet's choice).
DEFAULT_ENERGY_KEY = "uncorrected_total_energy"

# Stress: MPtrj keeps pymatgen's Vasprun ionic-step stress, in kBar with VASP's sign (compressive
# positive). ASE's convention is the opposite sign in eV/A^3, so stress_ase = -0.1 * GPa * kBar
# (= -stress_kbar * 0.1 / 160.21766208). Same factor and sign as ASE's own vasprun.xml reader
# (ase/io/vasp.py: `stress *= -0.1 * GPa`), Matbench Discovery's SevenNet MPtrj converter
# (`kbar_to_evpa3 = -0.1 * ase.units.GPa`), and CHGNet/M3GNet (MPtrj stress * -0.1 -> GPa, see
# CederGroupHub/chgnet#228 and materialsvirtuallab/m3gnet#2). The unit name is "kBar-vasp" in
# cfmtrain.readers.options.STRESS_UNITS.
MPTRJ_OPTIONS = ReadOptions(energy_key=DEFAULT_ENERGY_KEY, forces_key="force",
                            stress_key="stress", stress_unit="kBar-vasp")
KEPT_INFO = ("uncorrected_total_energy", "corrected_total_energy")

TITLE = "MPtrj JSON"
RANGES = False


def _ijson_backend():
    import ijson

    try:
        return ijson.get_backend("yajl2_c")
    except ImportError:
        warnings.warn("ijson's C backend (yajl2_c) is unavailable; parsing MPtrj with ijson's "
                      f"'{ijson.backend}' backend is several times slower", stacklevel=3)
        return ijson


def _open(path: Path):
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def read(part: Part, options: ReadOptions | None = None) -> Iterator[Read]:
    """Every record: labelled by `options` (a registered data set's key names and unit) if
    given, else as atoms in ASE's conventions for a data set's keys to find the labels."""
    if options is not None:
        yield from read_mptrj(part.path, options)
        return
    for mp_id, frame_id, record in records(part.path):
        yield record_to_atoms(record, str(part.path), frame_id, mp_id)


def read_mptrj(path: str | Path, opts: ReadOptions = MPTRJ_OPTIONS) -> Iterator[RawFrame]:
    """Stream every frame of an MPtrj JSON file (one material's frames in memory at a time)."""
    for mp_id, frame_id, record in records(path):
        yield record_to_frame(record, str(path), frame_id, mp_id, opts)


def records(path: str | Path) -> Iterator[tuple[str, str, dict]]:
    """(mp-id, frame-id, record) of every record; a file without records is an error."""
    import ijson

    path = Path(path)
    backend = _ijson_backend()
    count, mp_id = 0, None
    with _open(path) as f:
        try:
            for mp_id, frames in backend.kvitems(f, "", use_float=True):
                if not isinstance(frames, dict):
                    raise ValueError(f"{path}: material {mp_id}: expected an object of frames, "
                                     f"got {type(frames).__name__}")
                for frame_id, record in frames.items():
                    count += 1
                    yield mp_id, frame_id, record
        except ijson.JSONError as err:
            where = f"after material {mp_id}" if mp_id else "at the start"
            raise ValueError(f"{path}: invalid JSON {where}: {err}") from None
    if count == 0:
        raise ValueError(f"{path}: no MPtrj records (expected a JSON object "
                         f"mp-id -> frame-id -> record)")


def structure_arrays(structure: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """numbers, positions, cell, pbc of a pymatgen Structure.as_dict() (ordered sites only)."""
    lattice = structure["lattice"]
    cell = np.asarray(lattice["matrix"], dtype=float).reshape(3, 3)
    pbc = np.asarray(lattice.get("pbc", (True, True, True)), dtype=bool).reshape(3)
    numbers, positions = [], []
    for n, site in enumerate(structure["sites"]):
        species = site["species"]
        if len(species) != 1 or abs(float(species[0].get("occu", 1.0)) - 1.0) > 1e-8:
            raise ValueError(f"site {n} is disordered (species {species})")
        numbers.append(atomic_numbers.get(species[0]["element"], 0))
        xyz = site.get("xyz")
        positions.append(xyz if xyz is not None else np.dot(site["abc"], cell))
    return (np.asarray(numbers, dtype=int), np.asarray(positions, dtype=float).reshape(-1, 3),
            cell, pbc)


def record_to_frame(record: dict, source: str, frame_id: str, mp_id: str,
                    opts: ReadOptions = MPTRJ_OPTIONS) -> RawFrame:
    """One MPtrj record as a RawFrame (labels unconverted; malformed records carry a problem)."""
    try:
        numbers, positions, cell, pbc = structure_arrays(record["structure"])
    except (KeyError, TypeError, ValueError, IndexError) as err:
        empty = np.zeros((0, 3))
        return RawFrame(source, frame_id, np.zeros(0, int), empty, np.zeros((3, 3)),
                        np.zeros(3, bool), problem=("malformed record", f"structure: {err!r}"))
    info: dict = {"mp_id": str(record.get("mp_id", mp_id)), "mptrj_id": str(frame_id)}
    for key in KEPT_INFO:
        if isinstance(record.get(key), (int, float)):
            info[key] = float(record[key])
    arrays = {}
    magmom = record.get("magmom")
    if isinstance(magmom, list) and len(magmom) == len(numbers) and None not in magmom:
        arrays["REF_magmoms"] = np.asarray(magmom, dtype=float)
    return RawFrame(
        source=source, index=frame_id, numbers=numbers, positions=positions, cell=cell, pbc=pbc,
        energy=record.get(opts.energy_key), forces=record.get(opts.forces_key),
        stress=record.get(opts.stress_key) if opts.stress_key else None,
        stress_factor=opts.stress_factor, info=info, arrays=arrays,
    )


def record_to_atoms(record: dict, source: str, frame_id: str, mp_id: str) -> Read:
    """One MPtrj record as atoms whose calculator results are ASE's: the uncorrected energy (as
    MACE-MP-0 trains), the forces, and the stress in eV/A^3 with ASE's sign; both energies and
    the ids stay in info. A malformed record is a frame with its problem."""
    frame = record_to_frame(record, source, frame_id, mp_id)
    if frame.problem is not None:
        return frame
    atoms = Atoms(numbers=frame.numbers, positions=frame.positions, cell=frame.cell,
                  pbc=frame.pbc)
    atoms.info.update(frame.info)
    atoms.arrays.update(frame.arrays)
    try:
        stress = (None if frame.stress is None
                  else np.asarray(frame.stress, dtype=float) * frame.stress_factor)
        atoms.calc = SinglePointCalculator(atoms, energy=frame.energy, forces=frame.forces,
                                           stress=stress)
    except (TypeError, ValueError) as err:
        return problem_frame(source, frame_id, ("malformed record", f"labels: {err!r}"))
    return source, frame_id, atoms
