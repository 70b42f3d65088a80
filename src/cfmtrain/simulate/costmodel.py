"""Per-batch step-time model: t = c0 + c_atoms·atoms + c_edges·edges, fitted to the calibration's
median step times (cfmtrain sweep calibrate) by non-negative least squares on relative errors,
with the coefficients' covariance for an uncertainty band, and the accelerator assumption (a cost
flat below a saturation size) as an option of the model.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy import stats
from scipy.optimize import nnls

BAND_LEVEL = 0.95  # two-sided confidence of the fit's band


@dataclasses.dataclass
class CostModel:
    """Fitted step-time model, with its fit quality, covariance and provenance."""

    variant: str
    intercept_s: float
    per_atom_s: float
    per_edge_s: float
    data_wait_s: float = 0.0  # mean measured data wait per step, added to every simulated step
    # accelerator assumption: a batch below this many atoms costs as much as this many (0 = off)
    saturation_atoms: float = 0.0
    scale: float = 1.0  # the training runs' solo compute over the calibration's (sharing.py)
    shared_slowdown: float = 1.0  # a rank's compute while its node's other ranks compute too
    ranks_per_node: int = 1  # ranks that share a node, as the measured runs did
    # covariance of (intercept_s, per_atom_s, per_edge_s); zero rows for coefficients at 0
    covariance: list[list[float]] = dataclasses.field(
        default_factory=lambda: np.zeros((3, 3)).tolist())
    dof: int = 0  # residual degrees of freedom of the fit
    model_error: float = 0.0  # relative error seen on measured cells: widens the band
    samples: int = 0
    r2: float = float("nan")
    mean_rel_error: float = float("nan")
    max_rel_error: float = float("nan")
    sources: list[str] = dataclasses.field(default_factory=list)

    def features(self, atoms: np.ndarray, edges: np.ndarray) -> np.ndarray:
        """(..., 3) design rows (1, atoms, edges), each batch below the saturation size scaled
        up to it with its edges per atom (the accelerator assumption)."""
        atoms = np.asarray(atoms, dtype=np.float64)
        edges = np.asarray(edges, dtype=np.float64)
        if self.saturation_atoms > 0:
            scale = np.maximum(1.0, self.saturation_atoms / np.maximum(atoms, 1.0))
            atoms, edges = atoms * scale, edges * scale
        return np.stack([np.ones_like(atoms), atoms, edges], axis=-1)

    @property
    def coefficients(self) -> np.ndarray:
        return np.array([self.intercept_s, self.per_atom_s, self.per_edge_s])

    def compute_s(self, atoms: np.ndarray, edges: np.ndarray) -> np.ndarray:
        """Predicted seconds of a rank's own work (forward, backward, optimiser) per batch,
        computing alone on its node."""
        return self.features(atoms, edges) @ self.coefficients * self.scale

    def step_s(self, atoms: np.ndarray, edges: np.ndarray) -> np.ndarray:
        """Predicted seconds of a rank's step: data wait plus compute."""
        return self.data_wait_s + self.compute_s(atoms, edges)

    def band(self, seconds: float, features: np.ndarray) -> tuple[float, float]:
        """(low, high) of a prediction `seconds` whose compute part is `features` @ coefficients
        (summed design rows): the fit's BAND_LEVEL confidence interval (delta method, Student t),
        widened by the relative error seen on measured cells."""
        if self.dof <= 0:
            return 0.0, math.inf  # no residual to estimate the spread from
        var = float(features @ np.asarray(self.covariance) @ features) * self.scale**2
        half = stats.t.ppf(0.5 + BAND_LEVEL / 2, self.dof) * math.sqrt(max(var, 0.0))
        return (max(0.0, seconds - half) * (1 - self.model_error),
                (seconds + half) * (1 + self.model_error))


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


def fit_cost_model(points: pd.DataFrame, variant: str, sources: list[str] = (),
                   column: str = "step_s") -> CostModel:
    """Fit median step times (`column`) against `atoms` and `edges` of the calibration batches.

    Non-negative coefficients (more atoms or edges never make a batch faster), least squares on
    relative residuals (weights 1/t: small and large batches count alike). The covariance of the
    coefficients left free is s²(XᵀWX)⁻¹ with s² the weighted residual variance.
    """
    missing = {"atoms", "edges", column} - set(points.columns)
    if missing:
        raise ValueError(f"cost model for {variant}: points lack columns {sorted(missing)}")
    y = points[column].to_numpy(np.float64)
    if len(y) < 4:
        raise ValueError(f"cost model for {variant}: {len(y)} points; need at least 4")
    if not np.all(np.isfinite(y) & (y > 0)):
        raise ValueError(f"cost model for {variant}: step times must be finite and > 0")
    design = np.column_stack([np.ones(len(y)), points["atoms"].to_numpy(np.float64),
                              points["edges"].to_numpy(np.float64)])
    weighted = design / y[:, None]  # rows scaled by 1/t: residuals relative
    scale = np.maximum(np.abs(weighted).max(axis=0), 1e-300)  # conditioning of NNLS
    coef, _ = nnls(weighted / scale, np.ones(len(y)))
    coef = coef / scale
    free = coef > 0
    dof = len(y) - int(free.sum())
    covariance = np.zeros((3, 3))
    if dof > 0 and free.any():
        resid = (design @ coef - y) / y
        s2 = float(resid @ resid) / dof
        sub = weighted[:, free]
        covariance[np.ix_(free, free)] = s2 * np.linalg.pinv(sub.T @ sub)
    model = CostModel(variant, float(coef[0]), float(coef[1]), float(coef[2]),
                      covariance=covariance.tolist(), dof=dof, samples=len(y),
                      sources=[str(s) for s in sources])
    model.r2, model.mean_rel_error, model.max_rel_error = fit_quality(y, design @ coef)
    return model
