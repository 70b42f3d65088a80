"""Per-graph cell quantities as mace-torch's AtomicData.from_config computes them, vectorised over
graphs and edges; GraphDataset (one graph) and the batch assembler (a batch, or a whole store)
share them, so both give the same numbers bit for bit."""

from __future__ import annotations

import numpy as np
import torch


def molecule_cells(cells: np.ndarray, pbc: np.ndarray, extent: np.ndarray, cutoff: float
                   ) -> np.ndarray:
    """mace-torch's cell for non-periodic directions, per graph: a box of extent * 5 * cutoff
    (extent = largest |coordinate| + 1) so that stress and volume stay finite; shifts are
    unchanged since non-periodic unit shifts are zero. [graphs, 3, 3] float64."""
    cells = np.array(cells, dtype=np.float64)
    cells[~cells.any(axis=(1, 2))] = np.identity(3)
    graph, axis = np.nonzero(~np.asarray(pbc, bool))
    cells[graph, axis, :] = 0.0
    cells[graph, axis, axis] = (extent * 5 * cutoff)[graph]
    return cells


def edge_shifts(unit_shifts: torch.Tensor, cells: torch.Tensor, edge_graph: torch.Tensor
                ) -> torch.Tensor:
    """unit_shifts @ cell of each edge's graph (three products summed in a fixed order)."""
    c = cells[edge_graph]
    return (unit_shifts[:, 0:1] * c[:, 0] + unit_shifts[:, 1:2] * c[:, 1]
            + unit_shifts[:, 2:3] * c[:, 2])


def cell_fields(cells: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Volume and 2*pi*inv(cell^T) (zero where the volume is 0), as AtomicData.from_config."""
    volume = torch.linalg.det(cells)
    regular = volume.abs() > 0
    if bool(regular.all()):
        return volume, 2 * torch.pi * torch.linalg.inv(cells.mT)
    rcell = torch.zeros_like(cells)
    if bool(regular.any()):
        rcell[regular] = 2 * torch.pi * torch.linalg.inv(cells[regular].mT)
    return volume, rcell


def graph_extent(positions: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """Per graph (atoms ptr[i]:ptr[i+1]): the largest |coordinate| + 1 (1 for no atoms)."""
    counts = np.diff(ptr)
    largest = np.zeros(len(counts))
    filled = counts > 0
    if filled.any():
        largest[filled] = np.maximum.reduceat(np.abs(positions).max(axis=1), ptr[:-1][filled])
    return largest + 1.0


def cell_rows(cells: np.ndarray, pbc: np.ndarray, extent: np.ndarray, cutoff: float,
              dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Per graph in `dtype`: the cell (open directions boxed), its volume and rcell."""
    cell = torch.from_numpy(molecule_cells(cells, pbc, extent, cutoff)).to(dtype)
    volume, rcell = cell_fields(cell)
    return {"cell": cell, "volume": volume, "rcell": rcell}
