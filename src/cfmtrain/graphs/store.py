"""HDF5 graph shards: concatenated per-atom and per-edge arrays with offsets, and GraphStore.

One shard = one file; a folder of `shard_*.h5` files reads as one store in name order. The
per-graph table (num_atoms, num_edges, subsets) is loaded eagerly; arrays are read per graph
through file handles opened lazily in each process (h5py handles must not cross a fork).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import h5py
import numpy as np

from cfmtrain.atomic import atomic_path

FORMAT_VERSION = 1
ATOM_FIELDS = {"positions": np.float64, "numbers": np.uint8, "forces": np.float64}
EDGE_FIELDS = {"unit_shifts": np.int8}  # read back as int32
# name -> (dtype, shape of one graph's entry)
GRAPH_FIELDS = {"cell": (np.float64, (3, 3)), "pbc": (np.bool_, (3,)), "energy": (np.float64, ()),
                "stress": (np.float64, (3, 3)), "has_stress": (np.bool_, ()),
                "source_index": (np.int64, ())}


def write_shard(path: str | Path, graphs: Iterable[dict], *, cutoff: float,
                attrs: dict | None = None) -> int:
    """Write graphs (dicts with the GraphStore fields plus `subset` name and `source_index`) to
    one HDF5 shard atomically; returns the number of graphs written."""
    columns = _collect(graphs)
    num_edges = columns.pop("num_edges")
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        f.attrs.update({"format_version": FORMAT_VERSION, "cutoff": cutoff,
                        "subset_names": json.dumps(columns.pop("subset_names")),
                        **(attrs or {})})
        _write_table(f, columns.pop("num_atoms"), num_edges, columns.pop("subsets"))
        for k, dtype in ATOM_FIELDS.items():
            _write_concat(f, k, columns[k], dtype, (0, 3) if k != "numbers" else (0,))
        _write_concat(f, "unit_shifts", columns["unit_shifts"], np.int8, (0, 3))
        edges = np.empty((2, sum(num_edges)), np.int32)
        for row, parts in enumerate((columns["senders"], columns["receivers"])):
            if parts:
                np.concatenate(parts, out=edges[row], casting="unsafe")
        f.create_dataset("edge_index", data=edges)
        for k, (dtype, shape) in GRAPH_FIELDS.items():
            data = np.asarray(columns[k], dtype=dtype).reshape((len(num_edges), *shape))
            f.create_dataset(k, data=data)
    return len(num_edges)


_NO_STRESS = np.zeros((3, 3))


def _collect(graphs: Iterable[dict]) -> dict[str, list]:
    """The graphs' arrays as lists of parts per stored field (one pass, plain list appends)."""
    names = ("positions", "numbers", "forces", "unit_shifts", "senders", "receivers", "cell",
             "pbc", "energy", "stress", "has_stress", "source_index", "num_atoms", "num_edges",
             "subsets")
    columns: dict[str, list] = {k: [] for k in names}
    (positions, numbers, forces, shifts, senders, receivers, cells, pbcs, energies, stresses,
     has_stress, source_index, num_atoms, num_edges, subsets) = columns.values()
    subset_names: dict[str, int] = {}
    for g in graphs:
        positions.append(g["positions"])
        numbers.append(g["numbers"])
        forces.append(g["forces"])
        shifts.append(_int8_shifts(g["unit_shifts"]))
        edge_index = g["edge_index"]
        senders.append(edge_index[0])
        receivers.append(edge_index[1])
        stress = g.get("stress")
        has_stress.append(stress is not None)
        stresses.append(_NO_STRESS if stress is None else stress)
        cells.append(g["cell"])
        pbcs.append(g["pbc"])
        energies.append(g["energy"])
        source_index.append(g["source_index"])
        num_atoms.append(len(g["numbers"]))
        num_edges.append(edge_index.shape[1])
        subsets.append(subset_names.setdefault(g["subset"], len(subset_names)))
    columns["subset_names"] = list(subset_names)
    return columns


def _int8_shifts(shifts: np.ndarray) -> np.ndarray:
    """Cell shifts in the stored int8, refusing (never wrapping) a shift beyond +-127."""
    shifts = np.asarray(shifts)
    if shifts.dtype == np.int8:
        return shifts
    if shifts.size and np.abs(shifts).max() > np.iinfo(np.int8).max:
        raise ValueError(f"unit shift {int(np.abs(shifts).max())} beyond the stored range +-127")
    return shifts.astype(np.int8)


def _write_table(f: h5py.File, num_atoms: list, num_edges: list, subset_ids: list) -> None:
    f.create_dataset("num_atoms", data=np.asarray(num_atoms, np.int64))
    f.create_dataset("num_edges", data=np.asarray(num_edges, np.int64))
    f.create_dataset("subsets", data=np.asarray(subset_ids, np.int16))
    for name, counts in (("atom_offsets", num_atoms), ("edge_offsets", num_edges)):
        f.create_dataset(name, data=np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]))


def _write_concat(f: h5py.File, name: str, parts: list, dtype, empty_shape: tuple) -> None:
    data = (np.concatenate(parts, dtype=dtype, casting="unsafe") if parts
            else np.zeros(empty_shape, dtype))
    f.create_dataset(name, data=data)


def shard_files(path: str | os.PathLike) -> list[Path]:
    """The shards of one store: the file itself, or a folder's `shard_*.h5` in name order."""
    path = Path(path)
    files = sorted(path.glob("shard_*.h5")) if path.is_dir() else [path]
    if not files or not all(p.exists() for p in files):
        raise FileNotFoundError(f"{path}: no graph shard (shard_*.h5) found")
    return files


class GraphStore:
    """Read-only view of one shard file, a folder of `shard_*.h5` files, or a list of those
    (a union of data sets, in list order), indexed globally."""

    def __init__(self, path: str | os.PathLike | list[str | os.PathLike]):
        paths = list(path) if isinstance(path, (list, tuple)) else [path]
        self.path = Path(paths[0]) if len(paths) == 1 else tuple(map(Path, paths))
        self.files = [f for p in paths for f in shard_files(p)]
        names: list[str] = []
        atoms, edges, subsets = [], [], []
        self._atom_offsets, self._edge_offsets = [], []
        self.cutoff: float | None = None
        for file in self.files:
            with h5py.File(file, "r") as f:
                self._check(file, f)
                local = json.loads(f.attrs["subset_names"])
                for n in local:
                    if n not in names:
                        names.append(n)
                remap = np.array([names.index(n) for n in local] or [0], np.int16)
                atoms.append(f["num_atoms"][:])
                edges.append(f["num_edges"][:])
                subsets.append(remap[f["subsets"][:]] if len(local) else f["subsets"][:])
                self._atom_offsets.append(f["atom_offsets"][:])
                self._edge_offsets.append(f["edge_offsets"][:])
        self.subset_names = names
        self.num_atoms = np.concatenate(atoms)
        self.num_edges = np.concatenate(edges)
        self.subsets = np.concatenate(subsets)
        self._starts = np.concatenate([[0], np.cumsum([len(a) for a in atoms])])
        self._handles: dict[int, h5py.File] = {}
        self._pid = os.getpid()

    def _check(self, file: Path, f: h5py.File) -> None:
        if f.attrs.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{file}: not a cfmtrain graph shard of format {FORMAT_VERSION}")
        if self.cutoff is not None and f.attrs["cutoff"] != self.cutoff:
            raise ValueError(f"{file}: cutoff {f.attrs['cutoff']} differs from {self.cutoff}")
        self.cutoff = float(f.attrs["cutoff"])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_handles": {}}

    def _handle(self, shard: int) -> h5py.File:
        if os.getpid() != self._pid:  # forked worker: never reuse the parent's handles
            self._handles, self._pid = {}, os.getpid()
        if shard not in self._handles:
            self._handles[shard] = h5py.File(self.files[shard], "r")
        return self._handles[shard]

    def __getitem__(self, index: int) -> dict:
        if not -len(self) <= index < len(self):
            raise IndexError(f"graph {index} out of range for {len(self)} graphs in {self.path}")
        index = int(index) % len(self)
        shard = int(np.searchsorted(self._starts, index, side="right") - 1)
        local = index - int(self._starts[shard])
        f = self._handle(shard)
        a0, a1 = self._atom_offsets[shard][local: local + 2]
        e0, e1 = self._edge_offsets[shard][local: local + 2]
        graph = {k: f[k][a0:a1] for k in ATOM_FIELDS}
        graph["numbers"] = graph["numbers"].astype(np.int64)
        graph["edge_index"] = f["edge_index"][:, e0:e1].astype(np.int64)
        graph["unit_shifts"] = f["unit_shifts"][e0:e1].astype(np.int32)
        for k in ("cell", "pbc", "energy"):
            graph[k] = f[k][local]
        graph["energy"] = float(graph["energy"])
        if f["has_stress"][local]:
            graph["stress"] = f["stress"][local]
        graph["subset"] = self.subset_names[int(self.subsets[index])]
        return graph

    def close(self) -> None:
        """Close the file handles this process opened."""
        for h in self._handles.values():
            h.close()
        self._handles = {}
