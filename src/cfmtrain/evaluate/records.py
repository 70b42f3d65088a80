"""The tables `cfmtrain evaluate` writes, declared once: evaluation.csv (EvaluationRecord, a row
per config_type and `all`) and the parity plot's table (ParityRecord)."""

from __future__ import annotations

import dataclasses

from cfmtrain.tables import Record

ALL = "all"  # the row over every graph


@dataclasses.dataclass(frozen=True)
class EvaluationRecord(Record):
    """A model's errors on the graphs of one config_type (or `all`): energy per atom (meV/atom),
    force components (meV/Å) and stress components (meV/Å³, over the graphs that have a
    stress), mean absolute and root mean square."""

    config_type: str
    graphs: int
    atoms: int
    mae_energy_meV_per_atom: float
    rmse_energy_meV_per_atom: float
    mae_forces_meV_per_A: float
    rmse_forces_meV_per_A: float
    stress_graphs: int
    mae_stress_meV_per_A3: float
    rmse_stress_meV_per_A3: float

    TABLE = "evaluation table"
    WRITER = "`cfmtrain evaluate`"


@dataclasses.dataclass(frozen=True)
class ParityRecord(Record):
    """One point of the parity plot: a graph's energy per atom (eV/atom) or a force component
    (eV/Å; a seeded sample of them on large sets), reference and predicted."""

    quantity: str  # energy_per_atom or force
    config_type: str
    reference: float
    predicted: float

    TABLE = "parity table"
    WRITER = "`cfmtrain evaluate`"
