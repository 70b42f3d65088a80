"""Graphs from a GraphStore as mace-torch AtomicData, the training subset, and the data loaders.

The store's precomputed edges are used as they are (shifts = unit_shifts @ cell); nothing is
recomputed. Training, validation and test batches are assembled whole from the store's arrays
(train.batching) and prefetched (train.prefetch); GraphDataset's per-graph AtomicData is what
they equal (mace-torch's Collater over its items) and what tests compare with mace-torch.
"""

from __future__ import annotations

import numpy as np
import torch
from mace.data import AtomicData
from mace.tools import AtomicNumberTable

from cfmtrain.batches.batching import BatchAssembler
from cfmtrain.batches.cells import cell_fields, edge_shifts, graph_extent, molecule_cells
from cfmtrain.batches.prefetch import BatchLoader, resolve_workers
from cfmtrain.batches.store_arrays import store_arrays
from cfmtrain.graphs.store import GraphStore


def nested_subset(indices: np.ndarray, subsets: np.ndarray, fraction: float, seed: int
                  ) -> np.ndarray:
    """The first `fraction` of each subset's members in a seeded order, sorted: smaller
    fractions give subsets of larger ones (the nested small/medium/large sizes)."""
    if fraction >= 1.0:
        return np.asarray(indices, np.int64)
    rng = np.random.default_rng(seed)
    keep = []
    for subset in np.unique(subsets[indices]):
        members = rng.permutation(indices[subsets[indices] == subset])
        keep.append(members[: max(1, int(np.ceil(fraction * len(members))))])
    return np.sort(np.concatenate(keep)).astype(np.int64)


class GraphDataset(torch.utils.data.Dataset):
    """Graphs `indices` of `store` as AtomicData for a model with `z_table` and `cutoff`."""

    def __init__(self, store: GraphStore, indices: np.ndarray, z_table: AtomicNumberTable,
                 cutoff: float, dtype: torch.dtype, use_stress: bool = False):
        self.store, self.indices = store, np.asarray(indices, np.int64)
        self.cutoff, self.dtype, self.use_stress = cutoff, dtype, use_stress
        self.z_table = z_table
        self.z_to_index = np.full(119, -1, np.int64)
        self.z_to_index[list(z_table.zs)] = np.arange(len(z_table.zs))

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def num_atoms(self) -> np.ndarray:
        """Atoms per item (from the store's size table, no graph read)."""
        return self.store.num_atoms[self.indices]

    @property
    def num_edges(self) -> np.ndarray:
        """Edges per item."""
        return self.store.num_edges[self.indices]

    def graph(self, item: int) -> dict:
        """The raw graph dict of item `item`."""
        return self.store[int(self.indices[item])]

    def check_elements(self, index: int) -> None:
        """Raise ValueError naming store graph `index`'s elements that the model lacks."""
        numbers = self.store[int(index)]["numbers"]
        missing = sorted(set(numbers[self.z_to_index[numbers] < 0].tolist()))
        if missing:
            raise ValueError(f"{self.store.path}: graph {index} has elements {missing} that the "
                             f"model does not know (model elements: {list(self.z_table.zs)})")

    def __getitem__(self, item: int | tuple[int, float]) -> AtomicData:
        """Item `item`, or `(item, weight)` to weight the graph's loss (a repeated graph)."""
        item, weight = item if isinstance(item, tuple) else (item, 1.0)
        index = int(self.indices[item])
        g = self.store[index]
        g["store_id"] = index
        species = self.z_to_index[g["numbers"]]
        if (species < 0).any():
            self.check_elements(index)
        data = self.to_atomic_data(g, species)
        if weight != 1.0:
            data.weight = data.weight * weight
        return data

    def to_atomic_data(self, g: dict, species: np.ndarray) -> AtomicData:
        """The graph as mace-torch's AtomicData (the fields AtomicData.from_config fills)."""
        f = self.dtype
        n = len(species)
        extent = graph_extent(g["positions"], np.array([0, n]))
        cell_t = torch.as_tensor(molecule_cells(g["cell"][None], np.asarray(g["pbc"])[None],
                                                extent, self.cutoff)[0], dtype=f)
        unit_shifts = torch.as_tensor(g["unit_shifts"], dtype=f)
        one = torch.tensor(1.0, dtype=f)
        has_stress = self.use_stress and "stress" in g
        stress = torch.as_tensor(g["stress"], dtype=f) if has_stress else torch.zeros(3, 3, dtype=f)
        volume, rcell = cell_fields(cell_t)
        return AtomicData(
            edge_index=torch.as_tensor(g["edge_index"], dtype=torch.long),
            node_attrs=torch.nn.functional.one_hot(torch.as_tensor(species),
                                                   len(self.z_table)).to(f),
            positions=torch.as_tensor(g["positions"], dtype=f),
            shifts=edge_shifts(unit_shifts, cell_t[None],
                               torch.zeros(len(unit_shifts), dtype=torch.long)),
            unit_shifts=unit_shifts, cell=cell_t,
            weight=one, head=torch.tensor(0, dtype=torch.long), energy_weight=one,
            forces_weight=one, stress_weight=one if has_stress else torch.tensor(0.0, dtype=f),
            virials_weight=one, dipole_weight=torch.ones(1, 3, dtype=f), charges_weight=one,
            polarizability_weight=torch.ones(1, 3, 3, dtype=f),
            forces=torch.as_tensor(g["forces"], dtype=f), energy=torch.tensor(g["energy"], dtype=f),
            stress=stress.unsqueeze(0), virials=torch.zeros(1, 3, 3, dtype=f),
            dipole=torch.zeros(1, 3, dtype=f), charges=torch.zeros(n, dtype=f),
            polarizability=torch.zeros(1, 3, 3, dtype=f), elec_temp=torch.tensor(0.0, dtype=f),
            total_charge=torch.tensor(0.0, dtype=f), total_spin=one.clone(),
            pbc=torch.as_tensor(np.asarray(g["pbc"], bool)).view(1, 3),
            density_coefficients=torch.zeros(n, 1, dtype=f),
            rcell=rcell, volume=volume, fermi_level=torch.tensor(0.0, dtype=f),
            external_field=torch.zeros(1, 3, dtype=f),
            store_id=torch.tensor(int(g.get("store_id", -1))),
        )


def make_loader(dataset: GraphDataset, batch_sampler, num_workers: int | None = None,
                pin_memory: bool = False, cpus_per_rank: int = 1,
                device: torch.device | str | None = None) -> BatchLoader:
    """Batches of `dataset` over `batch_sampler`'s item lists, assembled whole from the store's
    arrays (held in memory when they fit, train.store_arrays) and prefetched per `num_workers`
    (None: auto; train.prefetch), for a training on `device` (None: the CPU; a CUDA device gets
    page-locked batches, and the PyTorch assembly where the compiled one is not built)."""
    arrays = store_arrays(dataset.store)
    workers = resolve_workers(num_workers, arrays.in_memory, cpus_per_rank)
    return BatchLoader(BatchAssembler(dataset, arrays, device), batch_sampler, workers,
                       pin_memory, device)
