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
from cfmtrain.train.store_arrays import ATOM_FIELDS, EDGE_FIELDS, STORED, StoreArrays

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


# Batch fields that are constant, grouped by shape after the graph axis so that each group is
# one allocation split into its fields.
ZEROS_PER_GRAPH = {(3, 3): ("virials", "polarizability"), (3,): ("dipole", "external_field"),
                   (): ("elec_temp", "total_charge", "fermi_level")}
ONES_PER_GRAPH = {(): ("energy_weight", "forces_weight", "virials_weight", "charges_weight",
                       "total_spin"), (3,): ("dipole_weight",), (3, 3): ("polarizability_weight",)}


def constants(graphs: int, atoms: int, dtype: np.dtype) -> dict[str, torch.Tensor]:
    """The constant batch fields (mace-torch's zeros and ones), each its own tensor."""
    out = {"charges": torch.from_numpy(np.zeros(atoms, dtype)),
           "density_coefficients": torch.from_numpy(np.zeros((atoms, 1), dtype)),
           "head": torch.from_numpy(np.zeros(graphs, np.int64))}
    for fill, groups in ((np.zeros, ZEROS_PER_GRAPH), (np.ones, ONES_PER_GRAPH)):
        for shape, names in groups.items():
            out.update(zip(names, map(torch.from_numpy, fill((len(names), graphs, *shape),
                                                             dtype)), strict=True))
    return out


GRAPH_ROWS = ("energy", "stress", "stress_weight", "cell", "volume", "rcell")


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
            **{k: v.numpy() for k, v in cells.items()}}


def derive_rows(arrays: StoreArrays, cutoff: float, dtype: torch.dtype, use_stress: bool
                ) -> dict[str, str]:
    """Add the GRAPH_ROWS of every graph and the shifts of every edge (in `dtype`) to in-memory
    `arrays` once; returns the field name of each."""
    names = {k: f"{k}@{cutoff}@{dtype}@{use_stress}" for k in (*GRAPH_ROWS, "shifts")}
    with arrays.lock:
        if names["shifts"] not in arrays.fields:
            fields = arrays.fields
            ptr = np.concatenate([[0], np.cumsum(arrays.num_atoms)])
            graphs = graph_rows(fields, ptr, cutoff, dtype, use_stress)
            edge_graph = torch.from_numpy(np.repeat(np.arange(len(ptr) - 1), arrays.num_edges))
            cells = torch.from_numpy(graphs["cell"])
            shifts = torch.empty((len(edge_graph), 3), dtype=dtype)
            for a in range(0, len(edge_graph), 1 << 20):  # bounded temporaries
                unit = torch.from_numpy(fields["unit_shifts"][a:a + (1 << 20)]).to(dtype)
                shifts[a:a + len(unit)] = edge_shifts(unit, cells, edge_graph[a:a + len(unit)])
            for k, v in graphs.items():
                arrays.add_field(names[k], "graphs", v)
            arrays.add_field(names["shifts"], "edges", shifts.numpy())
    return names


class BatchAssembler:
    """Callable: dataset items (`i` or `(i, weight)`) -> the mace-torch Batch of those graphs."""

    def __init__(self, dataset: GraphDataset, arrays: StoreArrays):
        self.dataset, self.arrays = dataset, arrays
        self.npf = numpy_dtype(dataset.dtype)
        self.derived = (derive_rows(arrays, dataset.cutoff, dataset.dtype, dataset.use_stress)
                        if arrays.in_memory else None)
        self.dtypes = {"forces": self.npf, "unit_shifts": self.npf,
                       "edge_index": np.dtype(np.int64)}
        if self.derived is None:  # the stored graph fields, and positions in float64 for cells
            self.names = STORED
        else:
            self.dtypes["positions"] = self.npf
            self.names = (*ATOM_FIELDS, *EDGE_FIELDS, "pbc", *self.derived.values())

    def __call__(self, items: Sequence) -> Batch:
        positions, weights = split_items(items)
        graphs = self.dataset.indices[positions]
        return self.assemble(graphs, weights)

    def assemble(self, graphs: np.ndarray, weights: np.ndarray | None) -> Batch:
        """The Batch of store graphs `graphs` with loss `weights` (None: all 1)."""
        ds, npf = self.dataset, self.npf
        n = len(graphs)
        num_atoms, num_edges = self.arrays.num_atoms[graphs], self.arrays.num_edges[graphs]
        ptr = np.zeros(n + 1, np.int64)
        np.cumsum(num_atoms, out=ptr[1:])
        rows = self.arrays.rows(graphs, self.names, self.dtypes, {"edge_index": ptr[:-1]})
        species = ds.z_to_index[rows["numbers"]]
        if (species < 0).any():
            ds.check_elements(graphs[np.searchsorted(ptr, np.argmax(species < 0), "right") - 1])
        if self.derived is None:
            fields = graph_rows(rows, ptr, ds.cutoff, ds.dtype, ds.use_stress)
            rows["positions"] = rows["positions"].astype(npf, copy=False)
            fields["shifts"] = edge_shifts(
                torch.from_numpy(rows["unit_shifts"]), torch.from_numpy(fields["cell"]),
                torch.from_numpy(np.repeat(np.arange(n), num_edges))).numpy()
        else:
            fields = {k: rows[name] for k, name in self.derived.items()}
        fields.update((k, rows[k]) for k in ("positions", "forces", "edge_index", "unit_shifts",
                                             "pbc"))
        fields["cell"] = fields["cell"].reshape(3 * n, 3)
        fields["rcell"] = fields["rcell"].reshape(3 * n, 3)
        fields["weight"] = np.ones(n, npf) if weights is None else weights.astype(npf)
        fields["store_id"] = graphs
        batch = Batch(batch=torch.from_numpy(np.repeat(np.arange(n), num_atoms)),
                      ptr=torch.from_numpy(ptr))
        # Batch(**fields) sets the same attributes, several times slower
        batch.__dict__.update(zip(fields, map(torch.from_numpy, fields.values()), strict=True))
        batch.__dict__.update(constants(n, int(ptr[-1]), npf),
                              node_attrs=one_hot(species, len(ds.z_table), npf))
        batch.__data_class__, batch.__num_graphs__ = AtomicData, n
        return batch
