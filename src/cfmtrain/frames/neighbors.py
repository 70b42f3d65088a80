"""Radius graphs with periodic boundaries from vesin's neighbour list.

Every periodic image within the cutoff is an edge (cells smaller than the cutoff included); the
convention is ASE's and MACE's: edge vector = pos[receiver] - pos[sender] + unit_shifts @ cell.
Unit shifts come back in the narrowest of int8 / int16 / int32 that holds them: int8 for any
sensible cell, wider for skewed cell vectors (a=3, b=(600.5, 3, 0): shifts near 200) or periodic
axes far shorter than the cutoff.

vesin's cell list has two regimes to stay out of. Above 1e5 cells it rescales its grid and, for a
flat or thin box (a large planar molecule, a wire with a wide open extent), rounds an axis to zero
cells and dies of a floating-point exception. Well below that, a grid of mostly empty cells is
slow: a 4-atom wire 2000 A across takes 27 s at 21k cells, 0.02 s at 160. `neighbor_pairs` keeps
the grid within a few cells per atom by searching a wider radius where needed and keeping the
pairs within the cutoff: the same pairs, for any extent, at the usual cost.
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
CUTOFF_RANGE = (1.0, 30.0)  # Angstrom: below, hardly a bond is an edge; above, no MACE model
MAX_CELLS = 50_000  # half of vesin's 1e5, above which its grid rescaling can divide by zero
CELLS_PER_ATOM, MIN_CELLS = 4, 256  # below max(these), the grid is never widened
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


_LISTS: dict[tuple[float, bool], vesin.NeighborList] = {}
_max, _min = np.maximum.reduce, np.minimum.reduce  # the ufuncs, without ndarray.max's wrapper


def check_cutoff(cutoff: float) -> float:
    """`cutoff` if it is a finite number of Angstrom in CUTOFF_RANGE, else a ValueError."""
    low, high = CUTOFF_RANGE
    if not (isinstance(cutoff, int | float) and math.isfinite(cutoff) and low <= cutoff <= high):
        raise ValueError(f"cutoff {cutoff!r}: expected a finite radius in [{low:g}, {high:g}] "
                         "Angstrom (MACE models use 4-6)")
    return float(cutoff)


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
    # copy=False returns views into vesin's buffers: each is copied once below, into the narrow
    # types the HDF5 shard stores (fewer bytes to copy and write), or only reduced. The pairs
    # are cast without transposing (a contiguous cast is ~3x faster); the shard writer gathers
    # each row of the transposed view into its concatenated edge_index anyway.
    pairs, shifts, d = neighbor_pairs(positions, cell, pbc, cutoff, full=True)
    # a full list holds every edge in both directions (shift S and -S): max = -min, one pass
    largest = int(_max(shifts, axis=None)) if len(d) else 0
    dtype = np.int8 if largest <= INT8_MAX else shift_dtype(largest)
    return RadiusGraph(pairs.astype(np.int32).T, shifts.astype(dtype),
                       float(_min(d, initial=np.inf)))


def search_radius(positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray,
                  cutoff: float) -> float:
    """The radius vesin searches for pairs within `cutoff`: `cutoff` itself, or a wider one
    where vesin's grid (per axis, the box's width over the radius) would hold more cells than
    CELLS_PER_ATOM per atom (at least MIN_CELLS, at most MAX_CELLS).
    Widths are bounded from above: a periodic axis by its cell vector's length, an open one by
    the positions' bounding-box diagonal plus twice the cutoff."""
    span = float(np.sqrt((np.ptp(positions, axis=0) ** 2).sum())) + 2 * cutoff
    lengths = np.sqrt((cell * cell).sum(axis=1)).tolist()
    widths = [length if periodic else span for length, periodic in zip(lengths, pbc.tolist(),
                                                                         strict=True)]
    cap = min(MAX_CELLS, max(MIN_CELLS, CELLS_PER_ATOM * len(positions)))
    radius = cutoff
    while math.prod(max(1.0, math.trunc(w / radius)) for w in widths) > cap:
        radius *= 1.25
    return radius


def neighbor_pairs(positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float,
                   full: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pairs (P, 2), unit shifts (P, 3), distances (P,)) of vesin's neighbour list within
    `cutoff`, sorted by sender; `full` lists each pair in both directions. Views into vesin's
    buffers, valid until the next call with the same cutoff and `full`. Any extent works: a
    box vesin's grid cannot hold is searched at a wider radius, then cut (module docstring)."""
    radius = search_radius(positions, cell, pbc, cutoff)
    key = (radius, full)
    nl = _LISTS.get(key)
    if nl is None:
        nl = _LISTS[key] = vesin.NeighborList(cutoff=radius, full_list=full, sorted=True,
                                              n_threads=1)  # shards run in parallel instead
    pairs, shifts, d = nl.compute(positions, cell, pbc, "PSd", copy=False)
    if radius != cutoff:
        keep = d < cutoff
        pairs, shifts, d = pairs[keep], shifts[keep], d[keep]
    return pairs, shifts, d
