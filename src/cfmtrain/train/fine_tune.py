"""Fine-tuning a mace-torch model (config `model.init_model`): its elements, cutoff and E0s
checked against the data before any step, each refusal naming the model file and the mismatch;
its E0s kept or replaced by the data's (`model.init_e0s`); and the replay graphs mixed into the
training split (`cfmtrain train --replay-graphs`, `replay_ratio`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from ase.data import chemical_symbols

from cfmtrain.batches.data import GraphDataset, make_loader
from cfmtrain.graphs.store import GraphStore
from cfmtrain.ranks.collectives import all_reduce_sum
from cfmtrain.train.config import ModelConfig
from cfmtrain.train.model import e0_values, read_e0s, z_table_of

E0_TOLERANCE_EV = 1e-3  # init_e0s check: the data's E0s and the model's agree within this


def _names(zs) -> str:
    return ", ".join(chemical_symbols[int(z)] for z in zs)


def model_elements(model: torch.nn.Module) -> list[int]:
    return [int(z) for z in model.atomic_numbers]


def model_e0s(model: torch.nn.Module) -> dict[int, float]:
    """{Z: eV} of a mace-torch model's atomic energies (its first head's)."""
    e0 = torch.atleast_2d(model.atomic_energies_fn.atomic_energies)[0].tolist()
    return dict(zip(model_elements(model), map(float, e0), strict=True))


def check_heads(path: str | Path, model: torch.nn.Module) -> None:
    """A model of one head (a multi-head model's heads would need mace-torch's head choice)."""
    heads = list(getattr(model, "heads", None) or ["Default"])
    if len(heads) > 1:
        raise ValueError(f"{path}: a model of {len(heads)} heads ({', '.join(heads)}); cfmtrain "
                         "fine-tunes a one-head model: keep one head first (mace-torch's "
                         "remove_pt_head, mace.tools.scripts_utils)")


def check_elements(path: str | Path, model: torch.nn.Module,
                   data: dict[str, np.ndarray]) -> None:
    """ValueError naming the model file, its elements and those of each data source (`data`:
    what -> atomic numbers) that it does not know."""
    known = set(model_elements(model))
    for where, zs in data.items():
        missing = sorted(set(int(z) for z in zs) - known)
        if missing:
            raise ValueError(f"{path}: the model knows {_names(sorted(known))}; {where} holds "
                             f"{_names(missing)}, which it does not: fine-tune a model that "
                             "knows every element of the data (its atomic_numbers), or train "
                             "one afresh (no model.init_model)")


def check_cutoff(path: str | Path, model: torch.nn.Module, cutoff: float) -> None:
    """The model's r_max within the graphs' cutoff (its edges are the store's, cut at r_max)."""
    r_max = float(model.r_max)
    if r_max > cutoff + 1e-9:
        raise ValueError(f"{path}: the model's r_max {r_max:g} Å exceeds the graphs' cutoff "
                         f"{cutoff:g} Å (config `cutoff`): its neighbours beyond {cutoff:g} Å "
                         f"would be missing; build the graphs with cutoff >= {r_max:g}")


def e0_source(cfg: ModelConfig) -> str:
    """Where the data's E0s come from, for messages: their file, or the setting."""
    if isinstance(cfg.e0s, str) and cfg.e0s.endswith(".json"):
        return cfg.e0s
    return "config model.e0s"


def e0_differences(mine: dict[int, float], given: dict[int, float], zs) -> list[str]:
    """'Cu -3.5 eV in the model, -0.007 given' for every element of `zs` whose E0s differ by
    more than E0_TOLERANCE_EV."""
    return [f"{chemical_symbols[z]} {mine[z]:.6g} eV in the model, {given[z]:.6g} given"
            for z in sorted(zs) if z in mine and z in given
            and abs(mine[z] - given[z]) > E0_TOLERANCE_EV]


def set_e0s(model: torch.nn.Module, values: dict[int, float]) -> None:
    """Replace the model's atomic energies of the elements in `values` (every head's)."""
    buffer = model.atomic_energies_fn.atomic_energies
    with torch.no_grad():
        for k, z in enumerate(model_elements(model)):
            if z in values:
                buffer[..., k] = values[z]


def estimate_e0s(model: torch.nn.Module, store: GraphStore, indices: np.ndarray,
                 rank: int = 0, world_size: int = 1, batch_graphs: int = 16
                 ) -> dict[int, float]:
    """mace-torch's E0s=estimated: the model's E0s shifted per element by the least-squares fit
    of its energy errors (reference - predicted) on graphs `indices` to their element counts;
    each rank evaluates a share, the normal equations are summed over ranks. Elements absent
    from the graphs keep their E0s."""
    zs = model_elements(model)
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    share = np.asarray(indices, np.int64)[rank::world_size]
    dataset = GraphDataset(store, share, z_table_of(model), float(model.r_max), dtype)
    order = list(range(len(dataset)))
    ata = torch.zeros(len(zs), len(zs), dtype=torch.float64)
    atb = torch.zeros(len(zs), dtype=torch.float64)
    for batch in make_loader(dataset, [order[i:i + batch_graphs]
                                       for i in range(0, len(order), batch_graphs)], 0):
        out = model(batch.to_dict(), training=False, compute_force=False)
        counts = torch.zeros(batch.num_graphs, len(zs), dtype=torch.float64).index_add_(
            0, batch.batch, batch.node_attrs.double())
        residual = (batch.energy - out["energy"]).detach().double()
        ata += counts.T @ counts
        atb += counts.T @ residual
    if world_size > 1:
        ata, atb = all_reduce_sum(ata), all_reduce_sum(atb)
    present = np.flatnonzero(torch.diagonal(ata).numpy() > 0)
    shift = np.zeros(len(zs))
    if len(present):
        shift[present] = np.linalg.lstsq(ata.numpy()[np.ix_(present, present)],
                                         atb.numpy()[present], rcond=None)[0]
    e0 = model_e0s(model)
    return {z: e0[z] + float(shift[k]) for k, z in enumerate(zs)}


def fine_tune_e0s(path: str | Path, model: torch.nn.Module, cfg: ModelConfig, zs: list[int],
                  fitted: Callable[[], dict[int, float]] | None = None,
                  estimated: Callable[[], dict[int, float]] | None = None) -> str:
    """Apply config model.init_e0s to the loaded `model` for the data's elements `zs`; returns
    the method recorded in summary.json. check: E0s the data gives (model.e0s a mapping or a
    file) must be the model's, else a ValueError naming the model file, the E0s' source and
    each difference; foundation: the model's kept; estimated: `estimated()` (estimate_e0s on
    the training split); data: replaced by the given ones, or by `fitted()` ({Z: eV} fitted on
    the training split's energies) when model.e0s is fit or average."""
    if cfg.init_e0s == "foundation":
        return f"foundation ({path})"
    if cfg.init_e0s == "estimated":
        given = None
    else:  # the elements given (a replay set's others keep the model's)
        given = None if e0_values(cfg.e0s, []) is None else read_e0s(cfg.e0s)
    if cfg.init_e0s == "check":
        if given is None:  # the data gives none: nothing to disagree with
            return f"foundation ({path})"
        differ = e0_differences(model_e0s(model), given, zs)
        if differ:
            raise ValueError(
                f"{path}: its E0s differ from those {e0_source(cfg)} gives ({'; '.join(differ)})"
                ": the data's energies may be on another reference. Set model.init_e0s: "
                "foundation to keep the model's (the data's energies on its reference, the same "
                "DFT settings: only the split of the energy per element differs), estimated to "
                "shift them by a fit of its energy errors on the training split (another "
                "reference: mace-torch's E0s=estimated), or data to take the data's")
        return f"foundation ({path}), checked against {e0_source(cfg)}"
    if cfg.init_e0s == "estimated":
        values, how = estimated(), "estimated: the model's, shifted by a fit of its errors"
    else:
        values = given if given is not None else fitted()
        how = f"data ({e0_source(cfg) if given is not None else 'fit on the training split'})"
    before = model_e0s(model)
    set_e0s(model, values)
    print(f"fine-tuning {path} with E0s {how}: " + ", ".join(
        f"{chemical_symbols[z]} {before[z]:.6g} -> {values[z]:.6g} eV" for z in sorted(values)
        if z in before), file=sys.stderr)
    return how


def replay_draw(indices: np.ndarray, own: int, ratio: float, seed: int) -> np.ndarray:
    """round(ratio x own) of the replay set's training graphs `indices`, a seeded draw without
    replacement (sorted); all of them if there are fewer."""
    count = int(round(ratio * own))
    indices = np.asarray(indices, np.int64)
    if count >= len(indices):
        return np.sort(indices)
    return np.sort(np.random.default_rng(seed).choice(indices, count, replace=False))
