"""mace-torch batches assembled straight from a store's arrays: for a list of dataset items, the
torch_geometric Batch that mace-torch's Collater makes of their AtomicData (GraphDataset), with
no per-graph object: one concatenation of row ranges per field (store_arrays) and whole-batch
tensor operations.

The cells come from train.cells, as GraphDataset's do, and the compiled op computes each edge's
shift (unit shifts @ cell) as train.cells.edge_shifts does, so the two paths give the same
numbers bit for bit. With the arrays in memory, the cells and the atoms' fields in the model's
precision are computed once for the whole store and then only gathered; the edge shifts are
computed per batch from the stored integer unit shifts (reading 3 bytes an edge instead of a
precomputed 12 or 24).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Protocol

import numpy as np
import torch
from mace.data import AtomicData
from mace.tools.torch_geometric.batch import Batch

import cfmtrain
from cfmtrain.batches import cells
from cfmtrain.batches.assembly import assemble_function, assembly_backend
from cfmtrain.batches.cells import cell_rows, graph_extent
from cfmtrain.batches.shared import merge_parts, shared_arrays
from cfmtrain.batches.store_arrays import STORED, StoreArrays


class GraphDataset(Protocol):
    """What batch assembly reads of a dataset (cfmtrain.batches.data.GraphDataset)."""

    cutoff: float
    dtype: torch.dtype
    use_stress: bool
    indices: np.ndarray
    z_to_index: np.ndarray
    z_table: object


def code_digest(*modules: ModuleType) -> str:
    """A digest of cfmtrain's version and the source files of `modules`."""
    digest = hashlib.sha256(cfmtrain.__version__.encode())
    for module in modules:
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


# how the cached arrays are derived (this module, the cells'): another version derives anew
DERIVED_BY = code_digest(sys.modules[__name__], cells)


def split_items(items: Sequence) -> tuple[np.ndarray, np.ndarray | None]:
    """Dataset positions and loss weights (None: all 1) of items `i` or `(i, weight)`."""
    if not len(items):
        raise ValueError("an empty batch")
    if isinstance(items[0], tuple):
        positions, weights = zip(*items, strict=True)
        return np.asarray(positions, np.int64), np.asarray(weights, np.float64)
    return np.asarray(items, np.int64), None


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype."""
    return torch.empty((), dtype=dtype).numpy().dtype


GRAPH_ROWS = ("energy", "stress", "stress_weight", "cell", "volume", "rcell")
# cfmtrain::assemble_batch's outputs, in order (kernels/batch_assembly.cpp)
OUTPUTS = ("batch", "ptr", "node_attrs", "positions", "forces", "edge_index", "unit_shifts",
           "shifts", *GRAPH_ROWS, "pbc", "weight",
           "virials", "polarizability", "dipole", "external_field", "elec_temp", "total_charge",
           "fermi_level", "charges", "density_coefficients", "head",
           "energy_weight", "forces_weight", "virials_weight", "charges_weight", "total_spin",
           "dipole_weight", "polarizability_weight")


def graph_rows(rows: dict[str, np.ndarray], ptr: np.ndarray, cutoff: float, dtype: torch.dtype,
               use_stress: bool) -> dict[str, np.ndarray]:
    """The GRAPH_ROWS batch fields (in `dtype`) of graphs with stored `rows` (atoms
    ptr[i]:ptr[i+1] of rows["positions"]): energy, stress (zero where absent or unused), its
    weight, and the cell (open directions boxed) with its volume and rcell."""
    cells = cell_rows(rows["cell"], rows["pbc"], graph_extent(rows["positions"], ptr), cutoff,
                      dtype)
    has_stress = rows["has_stress"] & use_stress
    npf = numpy_dtype(dtype)
    return {"energy": rows["energy"].astype(npf),
            "stress": np.where(has_stress[:, None, None], rows["stress"], 0.0).astype(npf),
            "stress_weight": has_stress.astype(npf),
            **{k: np.ascontiguousarray(v.numpy()) for k, v in cells.items()}}


def batch_parts(load: Callable[[str], np.ndarray], ptr: np.ndarray, dataset: GraphDataset
                ) -> dict[str, Callable[[], dict[str, np.ndarray]]]:
    """What assemble_batch gathers from, for graphs whose stored fields `load(name)` returns
    (atoms ptr[i]:ptr[i+1]): species, positions and forces in the model's precision, the
    GRAPH_ROWS (the cells among them, from which the op computes the edge shifts). As parts,
    each computed when called from the fields it needs, so that a caller deriving them for a
    whole store holds one part at a time (batches.shared)."""
    npf = numpy_dtype(dataset.dtype)
    graph_fields = ("cell", "pbc", "positions", "has_stress", "stress", "energy")
    return {
        "species": lambda: {"species": dataset.z_to_index[load("numbers")]},
        "positions": lambda: {"positions": load("positions").astype(npf)},
        "forces": lambda: {"forces": load("forces").astype(npf)},
        "edge_index": lambda: {"edge_index": load("edge_index")},
        "unit_shifts": lambda: {"unit_shifts": load("unit_shifts")},
        "graphs": lambda: {**graph_rows({k: load(k) for k in graph_fields}, ptr, dataset.cutoff,
                                        dataset.dtype, dataset.use_stress),
                           "pbc": load("pbc")},
    }


def batch_arrays(rows: dict[str, np.ndarray], ptr: np.ndarray, dataset: GraphDataset
                 ) -> dict[str, np.ndarray]:
    """`batch_parts` of graphs with stored `rows` (all fields), computed at once."""
    return merge_parts(batch_parts(rows.__getitem__, ptr, dataset))


class BatchAssembler:
    """Callable: dataset items (`i` or `(i, weight)`) -> the mace-torch Batch of those graphs,
    assembled by one cfmtrain::assemble_batch call over the store's arrays held in memory, or
    over the batch's rows read from the shards. For a training on `device` (default the CPU)
    without the compiled op, its PyTorch equivalent (batches.assembly.assembly_backend)."""

    def __init__(self, dataset: GraphDataset, arrays: StoreArrays,
                 device: torch.device | str | None = None):
        self.dataset, self.arrays = dataset, arrays
        self.backend = assembly_backend(device)  # "compiled" or "torch"
        self.npf = numpy_dtype(dataset.dtype)
        self.memory: dict[str, torch.Tensor] | None = None
        self.unknown: np.ndarray | None = None  # per store graph: has an element not modelled
        if arrays.in_memory:
            key = f"{dataset.cutoff}@{dataset.dtype}@{dataset.use_stress}@{dataset.z_table.zs}"
            ptr = np.concatenate([[0], np.cumsum(arrays.num_atoms)])
            with arrays.lock:
                if key not in arrays.derived:
                    arrays.derived[key] = shared_arrays(
                        arrays.folder, f"{arrays.fingerprint}@{DERIVED_BY}@{key}",
                        batch_parts(arrays.load, ptr, dataset), arrays.sources)
            derived = arrays.derived[key]
            self.memory = {k: torch.from_numpy(v) for k, v in derived.items()}
            for kind in ("atoms", "edges"):
                self.memory[f"{kind}_start"] = torch.from_numpy(arrays.starts[kind])
            self.memory["num_atoms"] = torch.from_numpy(arrays.num_atoms)
            self.memory["num_edges"] = torch.from_numpy(arrays.num_edges)
            self.unknown = np.logical_or.reduceat(derived["species"] < 0, ptr[:-1]) \
                if len(derived["species"]) else np.zeros(len(arrays.num_atoms), bool)

    def __call__(self, items: Sequence) -> Batch:
        positions, weights = split_items(items)
        graphs = self.dataset.indices[positions]
        return self.assemble(graphs, weights)

    def assemble(self, graphs: np.ndarray, weights: np.ndarray | None) -> Batch:
        """The Batch of store graphs `graphs` with loss `weights` (None: all 1)."""
        ds, n = self.dataset, len(graphs)
        if self.memory is not None:
            if self.unknown[graphs].any():
                ds.check_elements(graphs[np.argmax(self.unknown[graphs])])
            arrays, index = self.memory, torch.from_numpy(graphs)
        else:
            num_atoms, num_edges = self.arrays.num_atoms[graphs], self.arrays.num_edges[graphs]
            ptr = np.zeros(n + 1, np.int64)
            np.cumsum(num_atoms, out=ptr[1:])
            rows = batch_arrays(self.arrays.rows(graphs, STORED), ptr, ds)
            if (rows["species"] < 0).any():
                ds.check_elements(graphs[np.searchsorted(ptr, np.argmax(rows["species"] < 0),
                                                         "right") - 1])
            arrays = {k: torch.from_numpy(v) for k, v in rows.items()}
            arrays.update(atoms_start=torch.from_numpy(ptr[:-1]),
                          edges_start=torch.from_numpy(np.cumsum(num_edges) - num_edges),
                          num_atoms=torch.from_numpy(num_atoms),
                          num_edges=torch.from_numpy(num_edges))
            index = torch.arange(n)
        fields = assemble_function(self.backend)(
            index, arrays["atoms_start"], arrays["num_atoms"], arrays["edges_start"],
            arrays["num_edges"], arrays["species"], len(ds.z_table),
            [arrays["positions"], arrays["forces"]], arrays["edge_index"],
            arrays["unit_shifts"], arrays["cell"], [arrays[k] for k in (*GRAPH_ROWS, "pbc")],
            None if weights is None else torch.from_numpy(weights.astype(self.npf)))
        batch = Batch()
        batch.__dict__.update(zip(OUTPUTS, fields, strict=True))  # as Batch(**fields), faster
        batch.cell = batch.cell.view(3 * n, 3)
        batch.rcell = batch.rcell.view(3 * n, 3)
        batch.store_id = torch.from_numpy(graphs)
        batch.__data_class__, batch.__num_graphs__ = AtomicData, n
        return batch
