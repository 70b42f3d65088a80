"""Keys of structures that say when two graphs hold one structure, whatever the order of its
atoms, whether its positions were wrapped into the cell or moved by a lattice vector, and where
a molecule or slab sits along its open directions; copies that differ by rounding (a text
format's digits, a conversion to fractional coordinates and back) agree.

A structure's atoms are put in canonical coordinates: along a periodic cell vector the
fractional coordinate modulo 1; along the open directions (those orthogonal to the periodic
vectors; all three for a molecule) Cartesian coordinates in Å about the centroid. These are
binned on a grid of about TOLERANCE Å (periodic directions: a power of two of bins per cell
vector, so that a wrapped coordinate falls in the same bin), and the key hashes the multiset of
(element, bin) over the atoms (a sum of 64-bit hashes: no sort, vectorised) with the periodic
cell vectors (binned alike), the periodicity and the atom count. A coordinate within rounding of
a bin edge would put two copies in neighbouring bins, so each structure has OFFSETS keys, of
grids shifted by 1/OFFSETS of a bin: copies agree in at least one unless a coordinate lies near
an edge in every grid (for copies within 1e-8 Å, under 1e-6 for 100 atoms). Structures that
differ by more than one bin (at most TOLERANCE) in any coordinate never share a key.
"""

from __future__ import annotations

import numpy as np

from cfmtrain.graphs.store import GraphStore

TOLERANCE = 1e-4  # Å: the bin width (periodic directions: between half of it and it)
OFFSETS = 4  # grids shifted by 1/OFFSETS of a bin; a structure has a key in each
FIELDS = ("numbers", "positions", "cell", "pbc")
_MASK = np.uint64((1 << 64) - 1)
_BITS = np.uint64(21)  # bits per packed bin index (indices wrap at 2**21 bins, 210 Å)
_LOW = np.int64((1 << 21) - 1)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping arithmetic): well-spread 64-bit hashes."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


_ELEMENT = _mix(np.arange(256, dtype=np.uint64) + np.uint64(0x51ED))  # a hash per element


def _pack(bins: list[np.ndarray]) -> np.ndarray:
    """Three bin indices per atom (int64 arrays) as one uint64, 21 bits each."""
    x, y, z = ((b & _LOW).astype(np.uint64) for b in bins)
    return x | (y << _BITS) | (z << (_BITS + _BITS))


def _bases(cells: np.ndarray, pbc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per graph, the rows of the basis of its canonical coordinates and how many of them are
    periodic: its periodic cell vectors first, then orthonormal vectors spanning their
    orthogonal complement (the open directions); the identity (none periodic) for a molecule
    or a degenerate cell."""
    bases = np.tile(np.eye(3), (len(cells), 1, 1))
    periodic = np.zeros(len(cells), np.int64)
    code = pbc.astype(np.int64) @ np.array([1, 2, 4])  # the periodicity as 3 bits
    for found_code in np.unique(code[code > 0]).tolist():
        pattern = np.array([bool(found_code & 1), bool(found_code & 2), bool(found_code & 4)])
        which = np.flatnonzero(code == found_code)
        vectors = cells[which][:, pattern]  # (graphs, k, 3)
        k = vectors.shape[1]
        with np.errstate(invalid="ignore", divide="ignore"):
            if k == 2:
                normal = np.cross(vectors[:, 0], vectors[:, 1])
                open_ = (normal / np.linalg.norm(normal, axis=1, keepdims=True))[:, None]
            elif k == 1:
                axis = vectors[:, 0]
                least = np.eye(3)[np.argmin(np.abs(axis), axis=1)]  # the axis least along it
                first = np.cross(axis, least)
                first /= np.linalg.norm(first, axis=1, keepdims=True)
                second = np.cross(axis, first)
                second /= np.linalg.norm(second, axis=1, keepdims=True)
                open_ = np.stack([first, second], axis=1)
            else:
                open_ = np.zeros((len(which), 0, 3))
            found = np.concatenate([vectors, open_], axis=1)
            usable = np.isfinite(found).all(axis=(1, 2))
            usable[usable] = np.abs(np.linalg.det(found[usable])) > 1e-9
        bases[which[usable]] = found[usable]
        periodic[which[usable]] = k
    return bases, periodic


def _block_keys(block: dict) -> np.ndarray:
    """(graphs of the block, OFFSETS) uint64 keys of one block of graph_blocks' arrays (worked
    on one coordinate at a time: contiguous arrays of one value per atom). A coordinate's bin in
    the grid shifted by k/OFFSETS of a bin is (floor(OFFSETS x value) + k) // OFFSETS, in
    integers; along a cell vector, modulo its power-of-two count of bins."""
    counts = block["num_atoms"]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    bases, periodic = _bases(np.asarray(block["cell"], np.float64),
                             np.asarray(block["pbc"], bool))
    inverse = np.linalg.inv(bases)
    positions = np.ascontiguousarray(np.asarray(block["positions"], np.float64).T)
    lengths = np.linalg.norm(bases, axis=2)
    bins = 2.0 ** np.ceil(np.log2(np.maximum(lengths / TOLERANCE, 1.0)))  # per cell vector
    quarters, masks = [], []  # per coordinate: floor(OFFSETS x value); bins - 1 (-1: open)
    for j in range(3):  # coordinate j: fractional (periodic) or Å about the centroid (open)
        coord = sum(positions[i] * np.repeat(inverse[:, i, j], counts) for i in range(3))
        on_cell = periodic > j
        if on_cell.all():
            value = (coord - np.floor(coord)) * np.repeat(bins[:, j] * OFFSETS, counts)
        else:
            centroid = np.add.reduceat(coord, starts) / counts
            value = (coord - np.repeat(np.where(on_cell, 0.0, centroid), counts)) * (
                OFFSETS / TOLERANCE)
            if on_cell.any():
                cell = np.repeat(on_cell, counts)
                fraction = coord[cell] - np.floor(coord[cell])
                value[cell] = fraction * np.repeat(bins[on_cell, j] * OFFSETS, counts[on_cell])
        quarters.append(np.floor(value).astype(np.int64))
        masks.append(np.repeat(np.where(on_cell, bins[:, j] - 1, -1).astype(np.int64), counts))
    cells = (np.where((np.arange(3) < periodic[:, None])[:, :, None], bases, 0.0)
             * (OFFSETS / TOLERANCE)).reshape(len(counts), 9)
    cells = np.floor(cells).astype(np.int64)
    head = _mix(counts.astype(np.uint64) ^ (periodic.astype(np.uint64) << np.uint64(40)))
    element = _ELEMENT[np.asarray(block["numbers"]).astype(np.int64)]
    keys = np.empty((len(counts), OFFSETS), np.uint64)
    step = np.int64(OFFSETS.bit_length() - 1)  # OFFSETS is a power of two
    for k in range(OFFSETS):
        atom_bins = [((q + k) >> step) & mask for q, mask in zip(quarters, masks, strict=True)]
        with np.errstate(over="ignore"):
            key = _mix(np.add.reduceat(_mix(_pack(atom_bins) ^ element), starts) ^ head)
            for column in ((cells + k) >> step).T:
                key = _mix(key ^ column.astype(np.uint64))
        keys[:, k] = key
    return keys


def structure_keys(store: GraphStore) -> np.ndarray:
    """(graphs, OFFSETS) uint64: each graph's keys, in store order (module docstring); two
    graphs hold one structure if a column agrees."""
    keys = np.empty((len(store), OFFSETS), np.uint64)
    for selected, block in store.graph_blocks(np.arange(len(store)), FIELDS):
        keys[int(block["first"]) + selected] = _block_keys(block)[selected]
    return keys


def first_holders(keys: np.ndarray) -> np.ndarray:
    """Per graph, the first graph (in store order) holding its structure: the earliest graph
    that shares a key with it, followed through chains of shared keys; itself if none."""
    first = np.arange(len(keys))
    for column in keys.T:
        _, index, inverse = np.unique(column, return_index=True, return_inverse=True)
        first = np.minimum(first, index[inverse.reshape(-1)])
    while True:  # a copy of a copy: the first holder of the first holder
        deeper = first[first]
        if np.array_equal(deeper, first):
            return first
        first = deeper
