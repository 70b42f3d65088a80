"""The model: mace-torch's ScaleShiftMACE built from the config and training-set statistics
(E0s by least squares, avg_num_neighbors, shift and scale), or a user's .model to fine-tune.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from pathlib import Path

import mace  # noqa: F401  (before e3nn: mace sets up torch.load for e3nn's constants)
import numpy as np
import torch
from ase.data import atomic_numbers, chemical_symbols
from e3nn import o3
from mace import modules
from mace.tools import AtomicNumberTable

from cfmtrain.graphs.store import GraphStore
from cfmtrain.ranks.collectives import all_reduce_sum
from cfmtrain.train.config import ModelConfig
from cfmtrain.train.model_check import check_model_config  # noqa: F401  (imported from here)

MAX_Z = 119


@dataclasses.dataclass
class DataStats:
    """Training-set statistics the model is built from (plain data, saved in checkpoints)."""

    zs: list[int]
    e0s: list[float]  # per element of zs, eV
    avg_num_neighbors: float
    mean: float  # mean per-atom energy after E0s (ScaleShiftMACE shift)
    std: float  # RMS of the force components (mace-torch's rms_forces_scaling)
    e0s_method: str = "fit"  # fit, average, or where given values came from


def read_e0s(setting: str | dict) -> dict[int, float]:
    """{Z: eV} of a mapping from element symbol or atomic number to eV, or of a JSON file of
    one; an error names the source and the bad entry."""
    source = setting
    if isinstance(setting, str):
        path = Path(setting)
        if not path.is_file():
            raise ValueError(f"E0s {setting!r}: no such file (expected a JSON mapping of element "
                             "to eV)")
        try:
            setting = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not a JSON mapping of element to E0 in eV: {err}") from None
        if not isinstance(setting, dict):
            raise ValueError(f"{path}: not a JSON mapping of element to E0 in eV")
    values = {}
    for key, value in dict(setting).items():
        z = int(key) if str(key).isdigit() else atomic_numbers.get(str(key))
        if z is None or isinstance(value, bool) or not isinstance(value, int | float) \
                or not np.isfinite(value):
            raise ValueError(f"{source}: E0 entry {key!r}: {value!r} is not an element and a "
                             "finite energy in eV")
        values[z] = float(value)
    return values


def e0_values(setting: str | dict, zs: list[int]) -> dict[int, float] | None:
    """Given E0s for the elements `zs` from config `model.e0s` (a mapping from element symbol or
    atomic number to eV, or a JSON file of one), or None for `fit`/`average`."""
    if setting in ("fit", "average"):
        return None
    if isinstance(setting, str) and not Path(setting).is_file():
        raise ValueError(f"config model.e0s: {setting!r} is neither fit, average nor a file")
    values = read_e0s(setting)
    missing = [chemical_symbols[z] for z in zs if z not in values]
    if missing:
        raise ValueError(f"{setting}: no E0 for {', '.join(missing)} (elements of the data set; "
                         f"given: {', '.join(chemical_symbols[z] for z in sorted(values))})")
    return values


def fixed_e0s(setting: dict | list) -> dict[int, float]:
    """{Z: eV} of config `model.e0s_fixed`: a mapping, or JSON files of mappings (a union's
    members that give their isolated-atom energies); files that disagree on an element are an
    error naming both."""
    sources = [setting] if isinstance(setting, dict) else list(setting)
    values: dict[int, float] = {}
    origin: dict[int, str] = {}
    for source in sources:
        for z, value in read_e0s(source).items():
            if z in values and not np.isclose(values[z], value, rtol=0, atol=1e-6):
                raise ValueError(f"config model.e0s_fixed: {chemical_symbols[z]} is "
                                 f"{values[z]} eV in {origin[z]} but {value} eV in {source}")
            values[z], origin[z] = value, str(source if isinstance(source, str) else "mapping")
    return values


def _stat_sums(store: GraphStore, indices: np.ndarray) -> np.ndarray:
    """Per-rank sums: [AtA (MAX_Z^2), Atb, sum c/n, sum E/n, graphs, sum F^2, force comps,
    edges, atoms with an incoming edge]; A = element counts, b = energies. One vectorised pass
    over contiguous blocks of the store (GraphStore.graph_blocks), no loop over graphs; the
    edges are read only from shards without their per-graph receiver counts."""
    ata, atb = np.zeros((MAX_Z, MAX_Z)), np.zeros(MAX_Z)
    c_over_n, scalars = np.zeros(MAX_Z), np.zeros(6)
    if len(np.unique(indices)) != len(indices):
        raise ValueError("statistics over a graph listed twice")
    counted = store.num_receivers is not None  # else counted from the edges read
    fields = ("numbers", "energy", "forces") + (() if counted else ("edge_index",))
    for selected, block in store.graph_blocks(indices, fields):
        num_atoms, num_edges = block["num_atoms"], block["num_edges"]
        row = np.full(len(num_atoms), -1)
        row[selected] = np.arange(len(selected))
        atom_row = np.repeat(row, num_atoms)
        kept = atom_row >= 0
        counts = np.bincount(atom_row[kept] * MAX_Z + block["numbers"][kept],
                             minlength=len(selected) * MAX_Z).reshape(len(selected), MAX_Z)
        counts = counts.astype(np.float64)
        n, energy = num_atoms[selected].astype(np.float64), block["energy"][selected]
        zs = np.flatnonzero(counts.any(axis=0))  # the block's elements: a few of MAX_Z
        ata[np.ix_(zs, zs)] += counts[:, zs].T @ counts[:, zs]
        atb += counts.T @ energy
        c_over_n += (counts / n[:, None]).sum(axis=0)
        if counted:
            graphs = block["first"] + selected
            edges, receivers = num_edges[selected].sum(), store.num_receivers[graphs].sum()
        else:
            edge_row = np.repeat(row, num_edges)
            first_atom = np.concatenate([[0], np.cumsum(num_atoms)[:-1]])
            incoming = (np.repeat(first_atom, num_edges) + block["edge_index"][1])[edge_row >= 0]
            edges, receivers = len(incoming), len(np.unique(incoming))
        scalars += [(energy / n).sum(), len(selected), np.square(block["forces"][kept]).sum(),
                    3.0 * n.sum(), edges, receivers]
    return np.concatenate([ata.ravel(), atb, c_over_n, scalars])


def compute_stats(store: GraphStore, train: np.ndarray, extra_zs: np.ndarray,
                  rank: int = 0, world_size: int = 1, e0s: str | dict = "fit",
                  fixed: dict[int, float] | None = None) -> DataStats:
    """Statistics over the training graphs, each rank reading a share, summed by all-reduce.
    `extra_zs` are elements of the validation/test graphs the model must also know; `e0s` is
    config `model.e0s` (fit: least squares here; average: mace-torch's; or given values);
    `fixed` ({Z: eV}, with fit only) holds some elements at given values and fits the others to
    what remains of the energies."""
    sums = torch.from_numpy(_stat_sums(store, train[rank::world_size]))
    if world_size > 1:
        sums = all_reduce_sum(sums)
    sums = sums.numpy()
    k = MAX_Z * MAX_Z
    ata, atb = sums[:k].reshape(MAX_Z, MAX_Z), sums[k:k + MAX_Z]
    c_over_n = sums[k + MAX_Z:k + 2 * MAX_Z]
    e_over_n, graphs, f2, f_comps, edges, receivers = sums[k + 2 * MAX_Z:]
    present = np.flatnonzero(np.diag(ata) > 0)
    zs = sorted(set(present.tolist()) | set(np.asarray(extra_zs, int).tolist()))
    e0 = np.zeros(MAX_Z)
    given = e0_values(e0s, zs)
    if given is not None:
        e0[list(given)] = list(given.values())
        method = e0s if isinstance(e0s, str) else "mapping"
    elif e0s == "average":  # mace-torch's: the min-norm least squares of the count matrix
        e0[present] = np.linalg.pinv(ata[np.ix_(present, present)]) @ atb[present]
        method = "average"
    else:  # lstsq on the normal equations = mace-torch's min-norm lstsq on the count matrix
        fixed = fixed or {}
        if fixed and e0s != "fit":
            raise ValueError("E0s fixed for some elements need model.e0s fit for the others")
        held = np.array(sorted(fixed), dtype=int)
        free = np.array([z for z in present if z not in fixed], dtype=int)
        e0[held] = [fixed[z] for z in held]
        if len(free):  # the energies less the fixed elements' part, fitted by the free ones
            rhs = atb[free] - ata[np.ix_(free, held)] @ e0[held]
            e0[free] = np.linalg.lstsq(ata[np.ix_(free, free)], rhs, rcond=None)[0]
            loose = undetermined_elements(ata[np.ix_(free, free)], free)
            if loose and rank == 0:
                warnings.warn(_undetermined_message(store, loose, e0), stacklevel=2)
        method = "fit"
        if fixed:
            given = ", ".join(chemical_symbols[z] for z in held)
            fitted = ", ".join(chemical_symbols[z] for z in free) or "none"
            method = f"fit ({fitted}) with given {given}"
    if edges == 0:
        raise ValueError(f"{store.path}: the training graphs have no edges at all: the cutoff "
                         f"{store.cutoff} A is below every interatomic distance; build the graphs "
                         "with a larger cutoff (config `cutoff`)")
    mean = (e_over_n - c_over_n @ e0) / graphs
    rms = float(np.sqrt(f2 / f_comps)) if f_comps else 1.0
    return DataStats(zs=[int(z) for z in zs], e0s=[float(e0[z]) for z in zs],
                     avg_num_neighbors=float(edges / max(receivers, 1)), mean=float(mean),
                     std=rms if rms > 1e-8 else 1.0, e0s_method=method)


def undetermined_elements(ata: np.ndarray, zs: np.ndarray) -> list[int]:
    """The elements of `zs` whose least-squares E0 the training set leaves open: those in the
    null space of the normal matrix `ata` (they occur only in fixed proportions to each other)."""
    values, vectors = np.linalg.eigh(ata)
    null = vectors[:, values <= max(values.max(), 0.0) * 1e-9]
    return [int(z) for z, row in zip(zs, np.abs(null).sum(1), strict=True) if row > 1e-6]


def _undetermined_message(store: GraphStore, loose: list[int], e0: np.ndarray) -> str:
    names = ", ".join(chemical_symbols[z] for z in loose)
    split = ", ".join(f"{chemical_symbols[z]} {e0[z]:.6g}" for z in loose)
    return (f"E0 fit on {store.path}: the training graphs do not determine separate E0s for "
            f"{names} (they occur only in fixed proportions to each other), so least squares, "
            f"as mace-torch's, splits their energy arbitrarily (minimum norm: {split} eV). "
            "Energies of those proportions are unaffected; isolated atoms and other "
            "compositions are not: give the E0s (model.e0s, e.g. isolated-atom energies) or "
            "hold some with model.e0s_fixed")


def store_elements(store: GraphStore, indices: np.ndarray) -> np.ndarray:
    """The atomic numbers present in graphs `indices` of the store (read in blocks)."""
    seen = np.zeros(MAX_Z, bool)
    for selected, block in store.graph_blocks(indices, ("numbers",)):
        keep = np.zeros(len(block["num_atoms"]), bool)
        keep[selected] = True
        seen[block["numbers"][np.repeat(keep, block["num_atoms"])]] = True
    return np.flatnonzero(seen)


def build_model(cfg: ModelConfig, stats: DataStats, r_max: float, seed: int) -> torch.nn.Module:
    """ScaleShiftMACE with `cfg`'s sizes; the same seed gives the same initial weights."""
    torch.manual_seed(seed)
    block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
    return modules.ScaleShiftMACE(
        r_max=r_max, num_bessel=cfg.num_bessel, num_polynomial_cutoff=cfg.num_polynomial_cutoff,
        max_ell=cfg.max_ell, interaction_cls=block, interaction_cls_first=block,
        num_interactions=cfg.num_interactions, num_elements=len(stats.zs),
        hidden_irreps=o3.Irreps(cfg.hidden_irreps), MLP_irreps=o3.Irreps(cfg.mlp_irreps),
        atomic_energies=np.array([stats.e0s]), avg_num_neighbors=stats.avg_num_neighbors,
        atomic_numbers=stats.zs, correlation=cfg.correlation, gate=modules.gate_dict["silu"],
        radial_MLP=list(cfg.radial_mlp), radial_type="bessel", heads=["Default"],
        use_reduced_cg=cfg.use_reduced_cg, atomic_inter_scale=stats.std,
        atomic_inter_shift=stats.mean,
    )


def load_user_model(path: str | Path, cutoff: float) -> torch.nn.Module:
    """A mace-torch .model file (a full pickle) to fine-tune; checks its cutoff and elements."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: model file not found")
    print(f"note: loading {path} unpickles it, which runs code from that file; "
          "load only models you trust", file=sys.stderr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = torch.load(path, map_location="cpu", weights_only=False)
    if not hasattr(model, "atomic_numbers") or not hasattr(model, "r_max"):
        raise ValueError(f"{path}: not a mace-torch model (no atomic_numbers/r_max)")
    if float(model.r_max) > cutoff + 1e-9:
        raise ValueError(f"{path}: model r_max {float(model.r_max)} Å exceeds the graph "
                         f"store's cutoff {cutoff} Å; rebuild the graphs with a larger cutoff")
    return model


def stats_of(model: torch.nn.Module) -> DataStats:
    """The statistics a (user's) mace-torch model was built with, for the record."""
    e0 = torch.atleast_2d(model.atomic_energies_fn.atomic_energies)[0].tolist()
    scale_shift = getattr(model, "scale_shift", None)
    return DataStats(zs=[int(z) for z in model.atomic_numbers], e0s=[float(e) for e in e0],
                     avg_num_neighbors=float(model.interactions[0].avg_num_neighbors),
                     mean=float(torch.atleast_1d(scale_shift.shift)[0]) if scale_shift else 0.0,
                     std=float(torch.atleast_1d(scale_shift.scale)[0]) if scale_shift else 1.0)


def z_table_of(model: torch.nn.Module) -> AtomicNumberTable:
    """The model's element table."""
    return AtomicNumberTable([int(z) for z in model.atomic_numbers])
