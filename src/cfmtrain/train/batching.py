"""mace-torch batches assembled straight from a store's arrays: for a list of dataset items, the
torch_geometric Batch that mace-torch's Collater makes of their AtomicData (GraphDataset), with
no per-graph object: one concatenation of row ranges per field (store_arrays) and whole-batch
tensor operations.

The cells and edge shifts come from train.cells, as GraphDataset's do, so the two paths give
the same numbers bit for bit. With the arrays in memory, the edge shifts (in the model's
precision) and the cells are computed once for the whole store and then only gathered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from mace.data import AtomicData
from mace.tools.torch_geometric.batch import Batch

from cfmtrain.train.cells import cell_rows, edge_shifts, graph_extent
from cfmtrain.train.store_arrays import STORED, StoreArrays

if TYPE_CHECKING:
    from cfmtrain.train.data import GraphDataset


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


def one_hot(species: np.ndarray, classes: int, dtype: np.dtype) -> torch.Tensor:
    """[atoms, classes] one-hot rows of `species`, as torch.nn.functional.one_hot gives."""
    out = np.zeros((len(species), classes), dtype)
    out.reshape(-1)[np.arange(0, len(species) * classes, classes) + species] = 1
    return torch.from_numpy(out)


def derive_graph_rows(arrays: StoreArrays, cutoff: float, dtype: torch.dtype) -> dict[str, str]:
    """Add every graph's cell, volume, rcell and every edge's shifts (in `dtype`) to in-memory
    `arrays` once; returns the field names."""
    names = {k: f"{k}@{cutoff}@{dtype}" for k in ("cell", "volume", "rcell", "shifts")}
    with arrays.lock:
        if names["shifts"] not in arrays.fields:
            fields = arrays.fields
            ptr = np.concatenate([[0], np.cumsum(arrays.num_atoms)])
            cells = cell_rows(fields["cell"], fields["pbc"],
                              graph_extent(fields["positions"], ptr), cutoff, dtype)
            edge_graph = torch.from_numpy(np.repeat(np.arange(len(ptr) - 1), arrays.num_edges))
            shifts = torch.empty((len(edge_graph), 3), dtype=dtype)
            for a in range(0, len(edge_graph), 1 << 20):  # bounded temporaries
                unit = torch.from_numpy(fields["unit_shifts"][a:a + (1 << 20)]).to(dtype)
                shifts[a:a + len(unit)] = edge_shifts(unit, cells["cell"],
                                                      edge_graph[a:a + len(unit)])
            for k, v in cells.items():
                arrays.add_field(names[k], "graphs", v.numpy())
            arrays.add_field(names["shifts"], "edges", shifts.numpy())
    return names


class BatchAssembler:
    """Callable: dataset items (`i` or `(i, weight)`) -> the mace-torch Batch of those graphs."""

    def __init__(self, dataset: GraphDataset, arrays: StoreArrays):
        self.dataset, self.arrays = dataset, arrays
        self.npf = numpy_dtype(dataset.dtype)
        self.derived = (derive_graph_rows(arrays, dataset.cutoff, dataset.dtype)
                        if arrays.in_memory else None)
        self.dtypes = {"forces": self.npf, "unit_shifts": self.npf, "energy": self.npf,
                       "edge_index": np.dtype(np.int64)}
        if self.derived is not None:  # else the cells need the positions in float64 first
            self.dtypes["positions"] = self.npf
        self.names = STORED if self.derived is None else (
            *(k for k in STORED if k != "cell"), *self.derived.values())

    def __call__(self, items: Sequence) -> Batch:
        positions, weights = split_items(items)
        graphs = self.dataset.indices[positions]
        return self.assemble(graphs, weights)

    def assemble(self, graphs: np.ndarray, weights: np.ndarray | None) -> Batch:
        """The Batch of store graphs `graphs` with loss `weights` (None: all 1)."""
        ds, f = self.dataset, self.dataset.dtype
        n = len(graphs)
        num_atoms, num_edges = self.arrays.num_atoms[graphs], self.arrays.num_edges[graphs]
        ptr = np.zeros(n + 1, np.int64)
        np.cumsum(num_atoms, out=ptr[1:])
        rows = self.arrays.rows(graphs, self.names, self.dtypes, {"edge_index": ptr[:-1]})
        species = ds.z_to_index[rows["numbers"]]
        if (species < 0).any():
            ds.check_elements(graphs[np.searchsorted(ptr, np.argmax(species < 0), "right") - 1])
        unit_shifts = torch.from_numpy(rows["unit_shifts"])
        if self.derived is None:
            cell = cell_rows(rows["cell"], rows["pbc"], graph_extent(rows["positions"], ptr),
                             ds.cutoff, f)
            rows["positions"] = rows["positions"].astype(self.npf, copy=False)
            edge_graph = torch.from_numpy(np.repeat(np.arange(n), num_edges))
            cell["shifts"] = edge_shifts(unit_shifts, cell["cell"], edge_graph)
        else:
            cell = {k: torch.from_numpy(rows[name]) for k, name in self.derived.items()}
        has_stress = rows["has_stress"] & ds.use_stress
        stress = np.where(has_stress[:, None, None], rows["stress"], 0.0)
        atoms, npf = int(ptr[-1]), self.npf

        def zeros(*shape: int) -> torch.Tensor:
            return torch.from_numpy(np.zeros(shape, npf))

        def ones(*shape: int) -> torch.Tensor:
            return torch.from_numpy(np.ones(shape, npf))

        batch = Batch(batch=torch.from_numpy(np.repeat(np.arange(n), num_atoms)),
                      ptr=torch.from_numpy(ptr))
        batch.__dict__.update(  # Batch(**fields) sets the same attributes, several times slower
            edge_index=torch.from_numpy(rows["edge_index"]),
            node_attrs=one_hot(species, len(ds.z_table), npf),
            positions=torch.from_numpy(rows["positions"]), shifts=cell["shifts"],
            unit_shifts=unit_shifts, cell=cell["cell"].reshape(3 * n, 3),
            weight=ones(n) if weights is None else torch.from_numpy(weights.astype(npf)),
            head=torch.from_numpy(np.zeros(n, np.int64)), energy_weight=ones(n),
            forces_weight=ones(n), stress_weight=torch.from_numpy(has_stress.astype(npf)),
            virials_weight=ones(n), dipole_weight=ones(n, 3), charges_weight=ones(n),
            polarizability_weight=ones(n, 3, 3), forces=torch.from_numpy(rows["forces"]),
            energy=torch.from_numpy(rows["energy"]),
            stress=torch.from_numpy(stress.astype(npf)), virials=zeros(n, 3, 3),
            dipole=zeros(n, 3), charges=zeros(atoms), polarizability=zeros(n, 3, 3),
            elec_temp=zeros(n), total_charge=zeros(n), total_spin=ones(n),
            pbc=torch.from_numpy(rows["pbc"]), density_coefficients=zeros(atoms, 1),
            rcell=cell["rcell"].reshape(3 * n, 3), volume=cell["volume"], fermi_level=zeros(n),
            external_field=zeros(n, 3), store_id=torch.from_numpy(graphs))
        batch.__data_class__, batch.__num_graphs__ = AtomicData, n
        return batch
