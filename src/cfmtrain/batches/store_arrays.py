"""A GraphStore's concatenated shard arrays, held in memory or read per batch, vectorised.

Memory rule: a store's arrays (every field of every shard, plus the arrays derived from them
for training: `MEMORY_BYTES_PER_EDGE`) are held in memory when they need at most
`memory_budget()` bytes: a quarter of the node's available memory. They are held once per
node: the arrays a batch is gathered from (in the model's precision; the float64 originals are
dropped once they are derived) are memory-mapped from files that the first rank writes beside
the store (batches.shared), and a batch is gathered from them by one compiled call
(batches.batching). Otherwise each rank reads only its own batches' rows from the shards: one
HDF5 read per field and shard (the union of the batch's row ranges as one hyperslab
selection).
"""

from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path

import h5py
import numpy as np

from cfmtrain.graphs.store import GraphStore, open_shard, shard_errors

ATOM_FIELDS = ("positions", "numbers", "forces")
EDGE_FIELDS = ("edge_index", "unit_shifts")  # edge_index is [2, edges]: rows along axis 1
GRAPH_FIELDS = ("cell", "pbc", "energy", "stress", "has_stress")
STORED = (*ATOM_FIELDS, *EDGE_FIELDS, *GRAPH_FIELDS)
MEMORY_BYTES_PER_EDGE = 2  # derived: the atoms' fields in the model's precision (edges/atoms > 20)
SLICE_ROWS = 200  # mean rows per graph from which slicing ranges beats gathering rows
RANGE_READ_ROWS = 4  # mean rows per range from which a chunked dataset is read range by range
_AXIS = {"edge_index": 1}


def ranges_index(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Row numbers of the ranges [starts[i], starts[i] + counts[i]), concatenated."""
    ends = np.cumsum(counts)
    return np.repeat(starts - ends + counts, counts) + np.arange(ends[-1] if len(ends) else 0)


class RowRanges:
    """Row ranges [starts[i], starts[i] + counts[i]) to take from arrays: by slices when the
    ranges are long, by a row gather when short (the faster of the two)."""

    def __init__(self, starts: np.ndarray, counts: np.ndarray | None = None):
        """`counts` None: one row per range."""
        self.counts = np.ones(len(starts), np.int64) if counts is None else counts
        self.sliced = counts is not None and len(counts) > 0 and \
            counts.sum() >= SLICE_ROWS * len(counts)
        if self.sliced:
            self.bounds = list(zip(starts.tolist(), (starts + counts).tolist(), strict=True))
        else:
            self.index = starts if counts is None else ranges_index(starts, counts)

    def take(self, array: np.ndarray, axis: int = 0) -> np.ndarray:
        """The rows along `axis` (0 or 1), concatenated."""
        if self.sliced:
            parts = [array[a:b] for a, b in self.bounds] if axis == 0 else \
                [array[:, a:b] for a, b in self.bounds]
            return np.concatenate(parts, axis=axis)
        return array.take(self.index, axis=axis)


def memory_budget() -> int:
    """Bytes a node may hold of a store's arrays (shared by its ranks): a quarter of the
    available memory."""
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        pass
    return available // 4


class StoreArrays:
    """Per-field rows of any graphs of `store`, in memory or read per batch (module docstring).
    In memory, callers keep the arrays they compute from whole fields (`load`) in `derived`,
    and `starts` holds each graph's first atom and edge row."""

    def __init__(self, store: GraphStore, budget: int):
        self.files, self.states = list(store.files), list(store.states)
        self.num_atoms, self.num_edges = store.num_atoms, store.num_edges
        self.kind = {**dict.fromkeys(ATOM_FIELDS, "atoms"), **dict.fromkeys(EDGE_FIELDS, "edges"),
                     **dict.fromkeys(GRAPH_FIELDS, "graphs")}
        self.lock = threading.Lock()  # for the callers that fill `derived`
        self.derived: dict[str, dict[str, np.ndarray]] = {}  # arrays computed from `fields`
        self._handles: dict[int, h5py.File] = {}
        self._pid, self._file_lock = os.getpid(), threading.Lock()
        self._offsets: dict[str, list[np.ndarray]] = {"atoms": [], "edges": [], "graphs": []}
        nbytes = int(self.num_edges.sum()) * MEMORY_BYTES_PER_EDGE
        for shard in range(len(self.files)):
            f = self._file(shard)
            self._offsets["atoms"].append(f["atom_offsets"][:])
            self._offsets["edges"].append(f["edge_offsets"][:])
            self._offsets["graphs"].append(np.arange(len(f["num_atoms"]) + 1))
            nbytes += sum(f[k].nbytes for k in STORED)
        self.nbytes = nbytes
        self._graph_starts = np.cumsum([0] + [len(o) - 1 for o in self._offsets["graphs"]])
        self.in_memory = nbytes <= budget
        self.folder, self.fingerprint = Path(store.files[0]).parent, store.fingerprint
        # what arrays derived from the store derive from: each shard as it is now
        self.sources = {str(Path(f).resolve()): s for f, s in zip(self.files, self.states,
                                                                    strict=True)}
        if self.in_memory:
            self.starts = {"atoms": np.cumsum(self.num_atoms) - self.num_atoms,
                           "edges": np.cumsum(self.num_edges) - self.num_edges}
        self.close()

    def load(self, name: str) -> np.ndarray:
        """Every shard's `name` concatenated, read straight into one array."""
        datasets = [self._file(s)[name] for s in range(len(self.files))]
        axis = _AXIS.get(name, 0)
        shape = list(datasets[0].shape)
        shape[axis] = sum(d.shape[axis] for d in datasets)
        out = np.empty(shape, np.result_type(*(d.dtype for d in datasets)))
        start = 0
        for d, file in zip(datasets, self.files, strict=True):
            if d.shape[axis]:
                with shard_errors(file):  # a checksum failure names the shard
                    d.read_direct(out, dest_sel=(slice(None),) * axis
                                  + (slice(start, start + d.shape[axis]),))
            start += d.shape[axis]
        return out

    def _file(self, shard: int) -> h5py.File:
        if os.getpid() != self._pid:  # forked worker: never reuse the parent's handles or lock
            self._handles, self._pid, self._file_lock = {}, os.getpid(), threading.Lock()
        with self._file_lock:
            if shard not in self._handles:
                self._handles[shard] = open_shard(self.files[shard], self.states[shard])
            return self._handles[shard]

    def close(self) -> None:
        """Close the shard files this process opened."""
        for f in self._handles.values():
            f.close()
        self._handles = {}

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_handles", "_file_lock", "lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _handles={}, _file_lock=threading.Lock(),
                             lock=threading.Lock())

    def rows(self, graphs: np.ndarray, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        """Stored fields `names` of store graphs `graphs` (repeats allowed), in that order, read
        from the shards (one read per field and shard)."""
        counts = {"atoms": self.num_atoms[graphs], "edges": self.num_edges[graphs],
                  "graphs": np.ones(len(graphs), np.int64)}
        shard = np.searchsorted(self._graph_starts, graphs, side="right") - 1
        if (shard == shard[0]).all():
            return self._read_shard(int(shard[0]), graphs - self._graph_starts[shard[0]], names)
        # per shard, then from shard order (graphs `order`) back to batch order
        order = np.argsort(shard, kind="stable")
        parts = [self._read_shard(int(s), graphs[order[shard[order] == s]]
                                  - self._graph_starts[s], names) for s in np.unique(shard)]
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        ranges = {kind: RowRanges((np.cumsum(c[order]) - c[order])[back], c)
                  for kind, c in counts.items()}
        return {k: ranges[self.kind[k]].take(
            np.concatenate([p[k] for p in parts], axis=_AXIS.get(k, 0)), _AXIS.get(k, 0))
            for k in names}

    def _read_shard(self, shard: int, local: np.ndarray, names: tuple[str, ...]
                    ) -> dict[str, np.ndarray]:
        """Fields `names` of shard `shard`'s graphs `local`, in that order: one read per field
        of the distinct graphs' ranges (sorted, adjacent ones merged), then a gather."""
        unique, inverse = np.unique(local, return_inverse=True)
        in_order = len(unique) == len(local) and bool((np.diff(local) > 0).all())
        f, out, ranges = self._file(shard), {}, {}
        for k in names:
            offsets, axis, kind = self._offsets[self.kind[k]][shard], _AXIS.get(k, 0), self.kind[k]
            starts, stops = offsets[unique], offsets[unique + 1]
            with shard_errors(self.files[shard]):  # a checksum failure names the shard
                data = read_ranges(f[k], starts, stops, axis)
            if not in_order:
                if kind not in ranges:
                    counts = stops - starts
                    ranges[kind] = RowRanges((np.cumsum(counts) - counts)[inverse],
                                             counts[inverse])
                data = ranges[kind].take(data, axis)
            out[k] = data
        return out


def read_ranges(dataset: h5py.Dataset, starts: np.ndarray, stops: np.ndarray,
                axis: int = 0) -> np.ndarray:
    """Rows [starts[i], stops[i]) along `axis` of `dataset` (sorted, disjoint ranges),
    concatenated: one HDF5 read of the union of the ranges, or for a chunked (checksummed)
    dataset with ranges of several rows one read per range (HDF5 maps an irregular union onto
    chunks element by element: 5-60x slower there)."""
    new = np.ones(len(starts), bool)
    new[1:] = starts[1:] != stops[:-1]
    starts, stops = starts[new], stops[np.append(new[1:], True)]
    shape = list(dataset.shape)
    out_shape = [*shape]
    out_shape[axis] = int((stops - starts).sum())
    out = np.empty(out_shape, dataset.dtype)
    if out.size == 0:
        return out
    space = dataset.id.get_space()
    memory = h5py.h5s.create_simple(tuple(out_shape))
    start, count, at = [0] * len(shape), [*shape], [0] * len(shape)
    if dataset.chunks is not None and out_shape[axis] >= RANGE_READ_ROWS * len(starts):
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
            start[axis], count[axis] = a, b - a
            space.select_hyperslab(tuple(start), tuple(count))
            memory.select_hyperslab(tuple(at), tuple(count))
            dataset.id.read(memory, space, out)
            at[axis] += b - a
        return out
    space.select_none()
    for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
        start[axis], count[axis] = a, b - a
        space.select_hyperslab(tuple(start), tuple(count), op=h5py.h5s.SELECT_OR)
    dataset.id.read(memory, space, out)
    return out


_CACHE: weakref.WeakKeyDictionary[GraphStore, StoreArrays] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def store_arrays(store: GraphStore) -> StoreArrays:
    """The one StoreArrays of `store` in this process (train, valid and test share it)."""
    with _LOCK:
        if store not in _CACHE:
            _CACHE[store] = StoreArrays(store, memory_budget())
        return _CACHE[store]
