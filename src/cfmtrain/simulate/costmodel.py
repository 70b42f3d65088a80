"""Per-batch step-time model of one variant: t = c0 + c_atoms·atoms + c_edges·edges, fitted by
non-negative least squares to the per-step, per-rank compute times of measured training runs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from cfmtrain.atomic import atomic_path


@dataclasses.dataclass
class CostModel:
    """Fitted step-time model of one variant, with its fit quality and provenance."""

    variant: str
    intercept_s: float
    per_atom_s: float
    per_edge_s: float
    data_wait_s: float = 0.0  # mean measured data wait per step, added to every simulated step
    floor_atoms: float = 0.0  # batches below this many atoms cost as much as this many (GPU knee)
    samples: int = 0
    r2: float = float("nan")
    mean_rel_error: float = float("nan")
    max_rel_error: float = float("nan")
    sources: list[str] = dataclasses.field(default_factory=list)

    def compute_s(self, atoms: np.ndarray, edges: np.ndarray) -> np.ndarray:
        """Predicted seconds of a rank's own work (forward, backward, optimiser) per batch."""
        atoms = np.asarray(atoms, dtype=np.float64)
        edges = np.asarray(edges, dtype=np.float64)
        if self.floor_atoms > 0:
            # Below the saturation point a GPU takes the same time: scale the batch up to the knee
            # keeping its edges per atom.
            scale = np.maximum(1.0, self.floor_atoms / np.maximum(atoms, 1.0))
            atoms, edges = atoms * scale, edges * scale
        return self.intercept_s + self.per_atom_s * atoms + self.per_edge_s * edges

    def step_s(self, atoms: np.ndarray, edges: np.ndarray) -> np.ndarray:
        """Predicted seconds of a rank's step: data wait plus compute."""
        return self.data_wait_s + self.compute_s(atoms, edges)

    def to_json(self, path: str | Path) -> None:
        """Write the model as JSON atomically."""
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> CostModel:
        """Read a model written by `to_json`."""
        data = json.loads(Path(path).read_text())
        try:
            return cls(**data)
        except TypeError as err:
            raise ValueError(f"{path}: not a cost model file ({err})") from None


def fit_quality(measured: np.ndarray, predicted: np.ndarray) -> tuple[float, float, float]:
    """(R², mean relative error, max relative error) of predictions against measurements."""
    measured, predicted = np.asarray(measured, float), np.asarray(predicted, float)
    if measured.size == 0:
        raise ValueError("fit quality of no samples")
    resid = measured - predicted
    total = np.sum((measured - measured.mean()) ** 2)
    r2 = 1.0 - np.sum(resid**2) / total if total > 0 else float("nan")
    rel = np.abs(resid) / np.maximum(np.abs(measured), 1e-12)
    return float(r2), float(rel.mean()), float(rel.max())


LOCAL_WORK = ("compute_s", "optim_s")  # a rank's own work in a step: forward+backward, optimiser


def local_work_s(steps: pd.DataFrame) -> np.ndarray:
    """Seconds of each (step, rank) row's own work: compute plus optimiser step."""
    return steps[list(LOCAL_WORK)].sum(axis=1, min_count=len(LOCAL_WORK)).to_numpy(np.float64)


def fit_cost_model(steps: pd.DataFrame, variant: str, sources: list[str] = ()) -> CostModel:
    """Fit each (step, rank) row's own work (compute_s + optim_s) against its atoms and edges.

    Non-negative coefficients: more atoms or edges never make a batch faster. The mean of data_s
    (time waiting for the batch) becomes the model's per-step data wait.
    """
    missing = {"atoms", "edges", "data_s", *LOCAL_WORK} - set(steps.columns)
    if missing:
        raise ValueError(f"cost model for {variant}: step log lacks columns {sorted(missing)}")
    if len(steps) < 3:
        raise ValueError(f"cost model for {variant}: {len(steps)} step rows; need at least 3")
    y = local_work_s(steps)
    if not np.all(np.isfinite(y)):
        raise ValueError(f"cost model for {variant}: non-finite compute_s/optim_s in the step log")
    design = np.column_stack([np.ones(len(steps)), steps["atoms"].to_numpy(np.float64),
                              steps["edges"].to_numpy(np.float64)])
    # Scale columns so that NNLS is well conditioned, then undo the scaling.
    scale = np.maximum(np.abs(design).max(axis=0), 1e-12)
    coef, _ = nnls(design / scale, y)
    coef = coef / scale
    model = CostModel(variant, float(coef[0]), float(coef[1]), float(coef[2]),
                      data_wait_s=float(steps["data_s"].mean()),
                      samples=len(steps), sources=[str(s) for s in sources])
    model.r2, model.mean_rel_error, model.max_rel_error = fit_quality(
        y, model.compute_s(design[:, 1], design[:, 2]))
    return model
