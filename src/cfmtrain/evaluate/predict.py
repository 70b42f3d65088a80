"""A model's predictions on graphs of a store, reduced as they come to what the errors need:
per graph its energies and summed force and stress errors, and a seeded sample of force
components for the parity plot (all of them on small sets)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import torch

from cfmtrain.batches.data import GraphDataset, make_loader
from cfmtrain.graphs.store import GraphStore
from cfmtrain.train.model import z_table_of

FORCE_POINTS = 20_000  # force components kept for the parity plot (about)


@dataclasses.dataclass
class Predictions:
    """Per graph (`graphs`: store_id, config_type, atoms, energy_ref, energy_pred in eV;
    forces_abs, forces_sq: summed over its components; has_stress, stress_abs, stress_sq) and
    the sampled force components (`forces`: config_type, reference, predicted)."""

    graphs: pd.DataFrame
    forces: pd.DataFrame


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of the model's floating-point parameters."""
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


def predict(model: torch.nn.Module, store: GraphStore, indices: np.ndarray,
            batch_graphs: int = 16, device: str = "cpu", seed: int = 0) -> Predictions:
    """Energies, forces and stresses of `model` (as it is: its dtype, on `device`) on graphs
    `indices` of `store`, batched by cfmtrain's loader (mace-torch's batches)."""
    dtype = model_dtype(model)
    model = model.to(device)
    for p in model.parameters():
        p.requires_grad_(False)
    dataset = GraphDataset(store, np.asarray(indices, np.int64), z_table_of(model),
                           float(model.r_max), dtype, use_stress=True)
    order = list(range(len(dataset)))
    batches = [order[i:i + batch_graphs] for i in range(0, len(order), batch_graphs)]
    components = 3 * int(dataset.num_atoms.sum())
    keep = min(1.0, FORCE_POINTS / max(components, 1))
    rng = np.random.default_rng(seed)
    names = np.asarray(store.subset_names, dtype=object)
    rows, points = [], []
    for batch in make_loader(dataset, batches, num_workers=0):
        batch = batch.to(device)
        out = model(batch.to_dict(), training=False, compute_force=True, compute_stress=True)
        n = (batch.ptr[1:] - batch.ptr[:-1]).cpu().numpy()
        ids = batch.store_id.cpu().numpy()
        kinds = names[store.subsets[ids]]
        d_f = (out["forces"] - batch.forces).detach().double()
        owner = batch.batch
        f_abs = torch.zeros(len(n), dtype=torch.float64, device=d_f.device).index_add_(
            0, owner, d_f.abs().sum(-1))
        f_sq = torch.zeros_like(f_abs).index_add_(0, owner, d_f.square().sum(-1))
        has_stress = (batch.stress_weight > 0).cpu().numpy()
        d_s = (out["stress"] - batch.stress).detach().double().reshape(len(n), 9)
        rows.append(pd.DataFrame({
            "store_id": ids, "config_type": kinds, "atoms": n,
            "energy_ref": batch.energy.detach().double().cpu().numpy(),
            "energy_pred": out["energy"].detach().double().cpu().numpy(),
            "forces_abs": f_abs.cpu().numpy(), "forces_sq": f_sq.cpu().numpy(),
            "has_stress": has_stress,
            "stress_abs": np.where(has_stress, d_s.abs().sum(1).cpu().numpy(), 0.0),
            "stress_sq": np.where(has_stress, d_s.square().sum(1).cpu().numpy(), 0.0)}))
        ref = batch.forces.detach().double().cpu().numpy().ravel()
        pred = out["forces"].detach().double().cpu().numpy().ravel()
        chosen = np.flatnonzero(rng.random(len(ref)) < keep) if keep < 1 else np.arange(len(ref))
        atom_kind = np.repeat(kinds, 3 * n)
        points.append(pd.DataFrame({"config_type": atom_kind[chosen], "reference": ref[chosen],
                                    "predicted": pred[chosen]}))
    empty = pd.DataFrame(columns=["config_type", "reference", "predicted"])
    return Predictions(pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(),
                       pd.concat(points, ignore_index=True) if points else empty)
