"""Radius graphs with periodic boundaries from vesin's neighbour list.

Every periodic image within the cutoff is an edge (cells smaller than the cutoff included); the
convention is ASE's and MACE's: edge vector = pos[receiver] - pos[sender] + unit_shifts @ cell.
Unit shifts come back in the narrowest of int8 / int16 / int32 that holds them: int8 for any
sensible cell, wider for skewed cell vectors (a=3, b=(600.5, 3, 0): shifts near 200) or periodic
axes far shorter than the cutoff.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import vesin

INT8_MAX = 127
SHIFT_TYPES = (np.int8, np.int16, np.int32)  # narrowest first
MAX_EDGES = 1 << 25  # refuse a graph estimated above 33.5M edges (~1.2 GB inside vesin)
MAX_SELF_IMAGES = 100_000  # or one whose cell puts more images of an atom within the cutoff
_NO_BOX = np.zeros((3, 3))  # vesin wants no box at all for open systems
_NO_BOX.flags.writeable = False


class RadiusGraph(NamedTuple):
    """Edges of one structure: sender/receiver indices, integer cell shifts, shortest edge."""

    edge_index: np.ndarray  # (2, E) int32: row 0 sender, row 1 receiver (a transposed view)
    unit_shifts: np.ndarray  # (E, 3) int8, or int16 / int32 where int8 cannot hold them
    min_length: float  # shortest edge (inf without edges): the overlap check needs only this


class GraphTooLargeError(ValueError):
    """A periodic cell so small for the cutoff that its graph would not fit in memory."""

    reason = "cell too small for the cutoff"

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"{self.reason} ({detail})")


_LISTS: dict[float, vesin.NeighborList] = {}
_max, _min = np.maximum.reduce, np.minimum.reduce  # the ufuncs, without ndarray.max's wrapper


def shift_dtype(max_abs_shift: int) -> type[np.signedinteger]:
    """The narrowest stored type of unit shifts up to +-max_abs_shift."""
    for dtype in SHIFT_TYPES:
        if max_abs_shift <= np.iinfo(dtype).max:
            return dtype
    raise ValueError(f"unit shift {max_abs_shift} beyond int32")


def self_images(cell: np.ndarray, pbc: np.ndarray, cutoff: float) -> float:
    """About how many periodic images of one atom lie within `cutoff`: the measure of the
    cutoff sphere (or disc, or segment) over the cell's periodic volume (area, length)."""
    vectors = cell[pbc]
    if len(vectors) == 3:
        measure, ball = abs(float(np.linalg.det(vectors))), 4 / 3 * math.pi * cutoff**3
    elif len(vectors) == 2:
        measure, ball = float(np.linalg.norm(np.cross(vectors[0], vectors[1]))), \
            math.pi * cutoff**2
    else:
        measure, ball = float(np.linalg.norm(vectors[0])), 2 * cutoff
    return ball / measure if measure > 0 else math.inf


def radius_graph(
    positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float
) -> RadiusGraph:
    """All pairs (i, j, shift) with |pos[j] - pos[i] + shift @ cell| < cutoff, excluding i == j at
    zero shift; sorted by sender. Non-periodic directions may have a zero cell vector.

    Raises GraphTooLargeError for a periodic cell so small that the graph would be huge (more
    than MAX_SELF_IMAGES images of an atom, or an estimated MAX_EDGES edges)."""
    positions = np.ascontiguousarray(positions, dtype=np.float64)
    pbc = np.asarray(pbc, dtype=bool).reshape(3)
    if len(positions) == 0:
        return RadiusGraph(np.zeros((2, 0), np.int32), np.zeros((0, 3), np.int8), np.inf)
    periodic = any(pbc.tolist())  # ~10x cheaper than a numpy reduction on 3 values
    cell = np.asarray(cell, dtype=np.float64).reshape(3, 3) if periodic else _NO_BOX
    if periodic:
        images = self_images(cell, pbc, cutoff)
        # every atom sees about `images` images of every atom of a small cell: n^2 * images
        if images > MAX_SELF_IMAGES or len(positions) ** 2 * images > MAX_EDGES:
            raise GraphTooLargeError(
                f"about {images:.3g} periodic images of each atom within {cutoff} A, "
                f"{len(positions)} atoms, ~{len(positions) ** 2 * images:.3g} edges; "
                f"limits {MAX_SELF_IMAGES} images, {MAX_EDGES} edges")
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
    largest = int(_max(shifts, axis=None)) if len(d) else 0
    dtype = np.int8 if largest <= INT8_MAX else shift_dtype(largest)
    return RadiusGraph(pairs.astype(np.int32).T, shifts.astype(dtype),
                       float(_min(d, initial=np.inf)))
