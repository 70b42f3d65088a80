"""The errors of a model's predictions (evaluate.predict), per config_type and over all graphs:
mean absolute and root mean square errors of the energy per atom, the force components and the
stress components, as mace-torch's evaluation defines them (PerAtomMAE, its RMSE table)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from cfmtrain.evaluate.predict import Predictions
from cfmtrain.evaluate.records import ALL, EvaluationRecord, ParityRecord

MILLI = 1000.0


def _row(name: str, g: pd.DataFrame) -> EvaluationRecord:
    e = (g.energy_pred - g.energy_ref) / g.atoms
    comps = 3 * int(g.atoms.sum())
    stressed = g[g.has_stress.astype(bool)]
    s_comps = 9 * len(stressed)
    return EvaluationRecord(
        config_type=name, graphs=len(g), atoms=int(g.atoms.sum()),
        mae_energy_meV_per_atom=MILLI * float(e.abs().mean()),
        rmse_energy_meV_per_atom=MILLI * math.sqrt(float(np.square(e).mean())),
        mae_forces_meV_per_A=MILLI * float(g.forces_abs.sum()) / comps,
        rmse_forces_meV_per_A=MILLI * math.sqrt(float(g.forces_sq.sum()) / comps),
        stress_graphs=len(stressed),
        mae_stress_meV_per_A3=(MILLI * float(stressed.stress_abs.sum()) / s_comps
                               if s_comps else math.nan),
        rmse_stress_meV_per_A3=(MILLI * math.sqrt(float(stressed.stress_sq.sum()) / s_comps)
                                if s_comps else math.nan))


def error_rows(pred: Predictions) -> list[EvaluationRecord]:
    """One row per config_type (in name order), then `all`."""
    g = pred.graphs
    if g.empty:
        raise ValueError("no graphs to evaluate")
    rows = [_row(str(name), part) for name, part in g.groupby("config_type", sort=True)]
    return [*rows, _row(ALL, g)]


def parity_rows(pred: Predictions) -> list[ParityRecord]:
    """The parity plot's points: every graph's energy per atom, the sampled force components."""
    g = pred.graphs
    energy = [ParityRecord("energy_per_atom", str(k), float(r), float(p)) for k, r, p in zip(
        g.config_type, g.energy_ref / g.atoms, g.energy_pred / g.atoms, strict=True)]
    f = pred.forces
    forces = [ParityRecord("force", str(k), float(r), float(p))
              for k, r, p in zip(f.config_type, f.reference, f.predicted, strict=True)]
    return energy + forces
