"""Radius graphs with periodic boundaries from vesin's neighbour list.

Every periodic image within the cutoff is an edge (cells smaller than the cutoff included); the
convention is ASE's and MACE's: edge vector = pos[receiver] - pos[sender] + unit_shifts @ cell.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import vesin

INT8_MAX = 127  # unit shifts are stored as int8
_NO_BOX = np.zeros((3, 3))  # vesin wants no box at all for open systems
_NO_BOX.flags.writeable = False


class RadiusGraph(NamedTuple):
    """Edges of one structure: sender/receiver indices, integer cell shifts, shortest edge."""

    edge_index: np.ndarray  # (2, E) int32: row 0 sender, row 1 receiver (a transposed view)
    unit_shifts: np.ndarray  # (E, 3) int8 (|shift| <= 127: cells down to cutoff / 127)
    min_length: float  # shortest edge (inf without edges): the overlap check needs only this


_LISTS: dict[float, vesin.NeighborList] = {}
_max, _min = np.maximum.reduce, np.minimum.reduce  # the ufuncs, without ndarray.max's wrapper


def radius_graph(
    positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float
) -> RadiusGraph:
    """All pairs (i, j, shift) with |pos[j] - pos[i] + shift @ cell| < cutoff, excluding i == j at
    zero shift; sorted by sender. Non-periodic directions may have a zero cell vector."""
    positions = np.ascontiguousarray(positions, dtype=np.float64)
    pbc = np.asarray(pbc, dtype=bool).reshape(3)
    if len(positions) == 0:
        return RadiusGraph(np.zeros((2, 0), np.int32), np.zeros((0, 3), np.int8), np.inf)
    periodic = any(pbc.tolist())  # ~10x cheaper than a numpy reduction on 3 values
    cell = np.asarray(cell, dtype=np.float64).reshape(3, 3) if periodic else _NO_BOX
    nl = _LISTS.get(cutoff)
    if nl is None:
        nl = _LISTS[cutoff] = vesin.NeighborList(cutoff=cutoff, full_list=True, sorted=True,
                                                n_threads=1)  # shards run in parallel instead
    # copy=False returns views into vesin's buffers: each is copied once below, into the narrow
    # types the HDF5 shard stores (fewer bytes to copy and write), or only reduced. The pairs
    # are cast without transposing (a contiguous cast is ~3x faster); the shard writer gathers
    # each row of the transposed view into its concatenated edge_index anyway.
    pairs, shifts, d = nl.compute(positions, cell, pbc, "PSd", copy=False)
    # a full list holds every edge in both directions (shift S and -S): max = -min, one pass
    if len(d) and _max(shifts, axis=None) > INT8_MAX:
        raise ValueError(f"periodic image shift beyond +-{INT8_MAX} cells (cell vectors far "
                         f"shorter than the cutoff {cutoff} A): cell = {cell.tolist()}")
    return RadiusGraph(pairs.astype(np.int32).T, shifts.astype(np.int8),
                       float(_min(d, initial=np.inf)))
