"""HDF5 graph shards: concatenated per-atom and per-edge arrays with offsets, and GraphStore.

One shard = one file; a folder of `shard_*.h5` files reads as one store in name order. The
per-graph table (num_atoms, num_edges, subsets) is loaded eagerly; arrays are read per graph
through file handles opened lazily in each process (h5py handles must not cross a fork).

Integrity: a shard is written under a temporary name and renamed when complete. Every dataset
carries HDF5's Fletcher-32 checksum (checked by HDF5 on every read) and the file's metadata
(format >= 1.10 object headers and chunk indexes) its own checksums. The file's `manifest`
attribute holds its counts of graphs, atoms and edges. Opening a shard checks the manifest
against every dataset's shape and the offsets, and every edge index against its graph's atom
count (vectorised, one pass over edge_index). Any failure, at open or on a later read, is a
ShardError naming the file (and the graph where there is one).

The checks run once per shard file, not at every open: when they pass, a stamp beside the
shard (`shard_0000.h5.verified`, a small .npz) records the file's size, modification and change
times and inode (`file_state`) with its checked per-graph table and attributes. An open whose
stamp matches reads the stamp alone, not the shard. A shard rewritten, edited or replaced since
is checked again: a copy that keeps the modification time (cp -p, rsync -a, tar x) still has a
new change time and inode. A store notes each shard's state when it reads its table, and a
later open of a shard in another state is a ShardError naming it. A shard corrupted in place is
caught by the Fletcher-32 checksums on the reads that touch it. `cfmtrain graphs` verifies (and
stamps) each shard it writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import h5py
import numpy as np

from cfmtrain.atomic import atomic_path
from cfmtrain.frames.neighbors import shift_dtype
from cfmtrain.graphs import provenance
from cfmtrain.graphs.hdf5_write import hdf5_written

FORMAT_VERSION = 2  # 2: Fletcher-32 on every dataset, manifest, int8/int16/int32 shifts
LIBVER = ("v110", "v110")  # checksummed metadata; readable by HDF5 >= 1.10
CHUNK_BYTES = 1 << 16  # target chunk size: a per-graph read decodes little beyond its rows
BLOCK_EDGES = 1 << 20  # edges a shard writer holds before appending them (bounds its memory)
CHECK_EDGES = 1 << 23  # edges checked per block at open (bounded memory: 64 MiB of indices)
VERIFIED_SUFFIX = ".verified"  # the edge check's stamp beside a shard (module docstring)
ATOM_FIELDS = {"positions": np.float64, "numbers": np.uint8, "forces": np.float64}
SHIFT_DTYPES = ("int8", "int16", "int32")  # unit_shifts: the narrowest that holds the shard's
# name -> (dtype, shape of one graph's entry)
GRAPH_FIELDS = {"cell": (np.float64, (3, 3)), "pbc": (np.bool_, (3,)), "energy": (np.float64, ()),
                "stress": (np.float64, (3, 3)), "has_stress": (np.bool_, ()),
                "source_index": (np.int64, ())}
REBUILD = ("rebuild it: delete it and rerun `snakemake ... graphs` (or `cfmtrain graphs`)")


class ShardError(ValueError):
    """A graph shard that cannot be read or fails its checks; the message names the file, and
    the graph (its index within the shard) where there is one."""

    def __init__(self, path: str | os.PathLike, message: str, graph: int | None = None) -> None:
        self.path, self.graph = Path(path), graph
        where = f"{path}: graph {graph}" if graph is not None else str(path)
        super().__init__(f"{where}: {message}")


@contextlib.contextmanager
def shard_errors(path: str | os.PathLike, graph: int | None = None) -> Iterator[None]:
    """Re-raise HDF5 read failures (checksum mismatch, truncation) as ShardError naming
    `path` and `graph`."""
    try:
        yield
    except ShardError:
        raise
    except (OSError, KeyError, RuntimeError, ValueError, TypeError) as err:
        what = ("data failing its Fletcher-32 checksum" if "filter returned failure" in str(err)
                else "unreadable, corrupt or truncated")
        raise ShardError(path, f"{what} ({err}); {REBUILD}", graph) from err


def open_shard(path: str | os.PathLike, state: dict | None = None) -> h5py.File:
    """The shard opened read-only; a zero-byte, truncated or non-HDF5 file is a ShardError, and
    so is one whose `file_state` is no longer `state` (replaced or edited since its table was
    read: reading on would mix two versions)."""
    with shard_errors(path):
        f = h5py.File(path, "r")
        if state is not None and file_state(path) != state:
            f.close()
            raise ShardError(path, "replaced or edited since its table was read (size, times "
                             "or inode differ); rerun the command on the shard as it is now")
        return f


def write_shard(path: str | os.PathLike, graphs: Iterable[dict], *, cutoff: float,
                attrs: dict | None = None, block_edges: int = BLOCK_EDGES) -> int:
    """Write graphs (dicts with the GraphStore fields plus `subset` name and `source_index`) to
    one HDF5 shard atomically; returns the number of graphs written.

    The graphs are appended in blocks of about `block_edges` edges, so the writer holds one
    block, not the shard: its memory is bounded whatever the shard's size."""
    subset_names: dict[str, int] = {}
    table: dict[str, list] = {"num_atoms": [], "num_edges": [], "num_receivers": [],
                              "subsets": []}
    with atomic_path(path) as tmp, hdf5_written(tmp, libver=LIBVER) as f:
        f.attrs.update({"format_version": FORMAT_VERSION, "cutoff": cutoff, **(attrs or {})})
        block: list[dict] = []
        edges = 0
        for g in graphs:
            block.append(g)
            edges += g["edge_index"].shape[1]
            if edges >= block_edges:
                _append_block(path, f, _collect(block, subset_names), table)
                block, edges = [], 0
        _append_block(path, f, _collect(block, subset_names), table)
        num_atoms = np.asarray(table["num_atoms"], np.int64)
        num_edges = np.asarray(table["num_edges"], np.int64)
        _append(f, "num_atoms", num_atoms)
        _append(f, "num_edges", num_edges)
        _append(f, "num_receivers", np.asarray(table["num_receivers"], np.int64))
        _append(f, "subsets", np.asarray(table["subsets"], np.int16))
        for name, counts in (("atom_offsets", num_atoms), ("edge_offsets", num_edges)):
            _append(f, name, np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]))
        manifest = {"graphs": len(num_atoms), "atoms": int(num_atoms.sum()),
                    "edges": int(num_edges.sum()),
                    "unit_shifts": f["unit_shifts"].dtype.name}
        f.attrs.update({"subset_names": json.dumps(list(subset_names)),
                        "manifest": json.dumps(manifest)})
    return len(num_atoms)


_NO_STRESS = np.zeros((3, 3))


def _collect(graphs: list[dict], subset_names: dict[str, int]) -> dict[str, list]:
    """The graphs' arrays as lists of parts per stored field (one pass, plain list appends);
    subset names get ids in `subset_names` (shared over a shard's blocks)."""
    names = ("positions", "numbers", "forces", "unit_shifts", "senders", "receivers", "cell",
             "pbc", "energy", "stress", "has_stress", "source_index", "num_atoms", "num_edges",
             "num_receivers", "subsets")
    columns: dict[str, list] = {k: [] for k in names}
    (positions, numbers, forces, shifts, senders, receivers, cells, pbcs, energies, stresses,
     has_stress, source_index, num_atoms, num_edges, num_receivers, subsets) = columns.values()
    for g in graphs:
        positions.append(g["positions"])
        numbers.append(g["numbers"])
        forces.append(g["forces"])
        shifts.append(np.asarray(g["unit_shifts"]))
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
        # atoms with an incoming edge: the statistics' neighbour count needs no edge read
        num_receivers.append(len(np.unique(edge_index[1])))
        subsets.append(subset_names.setdefault(g["subset"], len(subset_names)))
    return columns


def _append_block(path: str | os.PathLike, f: h5py.File, columns: dict[str, list],
                  table: dict[str, list]) -> None:
    """Append one block's columns to the shard's datasets (created by the first block)."""
    for k in table:
        table[k].extend(columns[k])
    graphs = len(columns["num_atoms"])
    for k, dtype in ATOM_FIELDS.items():
        _append(f, k, _concat(columns[k], dtype, (0, 3) if k != "numbers" else (0,)))
    edges = np.empty((2, sum(columns["num_edges"])), np.int32)
    for row, parts in enumerate((columns["senders"], columns["receivers"])):
        if parts:
            np.concatenate(parts, out=edges[row], casting="unsafe")
    _append(f, "edge_index", edges, axis=1)
    _append_shifts(path, f, columns["unit_shifts"])
    for k, (dtype, shape) in GRAPH_FIELDS.items():
        _append(f, k, np.asarray(columns[k], dtype=dtype).reshape((graphs, *shape)))


def _append_shifts(path: str | os.PathLike, f: h5py.File, parts: list[np.ndarray]) -> None:
    """Append unit shifts in the narrowest type that holds every shift of the shard so far:
    a block that needs a wider type rewrites the (small) dataset once in it."""
    largest = max((int(np.abs(p).max()) for p in parts if p.dtype != np.int8 and p.size),
                  default=0)
    try:
        needed = np.dtype(shift_dtype(largest))
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    if "unit_shifts" in f and f["unit_shifts"].dtype.itemsize < needed.itemsize:
        written = f["unit_shifts"][:]
        del f["unit_shifts"]
        _append(f, "unit_shifts", written.astype(needed))
    stored = f["unit_shifts"].dtype if "unit_shifts" in f else needed
    _append(f, "unit_shifts", _concat(parts, stored, (0, 3)))


def _concat(parts: list, dtype: type, empty_shape: tuple) -> np.ndarray:
    return (np.concatenate(parts, dtype=dtype, casting="unsafe") if parts
            else np.zeros(empty_shape, dtype))


def _chunks(data: np.ndarray, axis: int) -> tuple[int, ...]:
    """About CHUNK_BYTES a chunk along `axis`."""
    row = [n for i, n in enumerate(data.shape) if i != axis]
    chunks = list(data.shape)
    chunks[axis] = max(1, CHUNK_BYTES // (data.dtype.itemsize * max(1, int(np.prod(row)))))
    return tuple(chunks)


def _append(f: h5py.File, name: str, data: np.ndarray, axis: int = 0) -> None:
    """Append `data` along `axis` to the resizable dataset `name` (created with about
    CHUNK_BYTES a chunk and Fletcher-32 checksums on first use)."""
    if name not in f:
        maxshape = list(data.shape)
        maxshape[axis] = None
        f.create_dataset(name, data=data, chunks=_chunks(data, axis), maxshape=tuple(maxshape),
                         fletcher32=True)
        return
    d = f[name]
    at = d.shape[axis]
    d.resize(at + data.shape[axis], axis=axis)
    if data.shape[axis]:
        d[(slice(None),) * axis + (slice(at, None),)] = data


def shard_files(path: str | os.PathLike) -> list[Path]:
    """The shards of one store: the file itself, or a folder's `shard_*.h5` in name order."""
    path = Path(path)
    files = sorted(path.glob("shard_*.h5")) if path.is_dir() else [path]
    if not files or not all(p.exists() for p in files):
        raise FileNotFoundError(f"{path}: no graph shard (shard_*.h5) found")
    return files


def read_table(path: str | os.PathLike, f: h5py.File, check_edges: bool = True
               ) -> dict[str, np.ndarray]:
    """The per-graph table of an open shard, after its checks (module docstring): manifest,
    shapes, offsets, subsets and (if `check_edges`) edge indices. Raises ShardError naming
    `path`."""
    version = f.attrs.get("format_version")
    if version != FORMAT_VERSION:
        if version is not None and version < FORMAT_VERSION:
            raise ShardError(path, f"graph shard of format {version}, without checksums or "
                             f"manifest (format {FORMAT_VERSION}); {REBUILD}")
        raise ShardError(path, f"not a cfmtrain graph shard of format {FORMAT_VERSION} "
                         f"(format_version {version})")
    with shard_errors(path):
        manifest = json.loads(f.attrs["manifest"])
        graphs, atoms, edges = (int(manifest[k]) for k in ("graphs", "atoms", "edges"))
        table = {k: f[k][:] for k in ("num_atoms", "num_edges", "subsets", "atom_offsets",
                                      "edge_offsets", "num_receivers") if k in f}
        shapes = {k: f[k].shape for k in f}
        shift_type = f["unit_shifts"].dtype
    expected = {"num_atoms": (graphs,), "num_edges": (graphs,), "subsets": (graphs,),
                **({"num_receivers": (graphs,)} if "num_receivers" in table else {}),
                "atom_offsets": (graphs + 1,), "edge_offsets": (graphs + 1,),
                "positions": (atoms, 3), "numbers": (atoms,), "forces": (atoms, 3),
                "edge_index": (2, edges), "unit_shifts": (edges, 3),
                **{k: (graphs, *shape) for k, (_, shape) in GRAPH_FIELDS.items()}}
    for k, shape in expected.items():
        if shapes.get(k) != shape:
            raise ShardError(path, f"dataset {k} has shape {shapes.get(k)}, the manifest "
                             f"({graphs} graphs, {atoms} atoms, {edges} edges) says {shape}; "
                             f"{REBUILD}")
    if shift_type.name not in SHIFT_DTYPES:
        raise ShardError(path, f"unit_shifts of type {shift_type}, expected one of "
                         f"{SHIFT_DTYPES}")
    for counts, offsets, total in (("num_atoms", "atom_offsets", atoms),
                                   ("num_edges", "edge_offsets", edges)):
        c, o = table[counts], table[offsets]
        bad = np.flatnonzero((c < 0) | (o[1:] - o[:-1] != c))
        if len(bad) or o[0] != 0 or o[-1] != total:
            graph = int(bad[0]) if len(bad) else None
            raise ShardError(path, f"{counts} and {offsets} disagree (or with the manifest's "
                             f"{total}); {REBUILD}", graph)
    names = json.loads(f.attrs["subset_names"])
    bad = np.flatnonzero((table["subsets"] < 0) | (table["subsets"] >= max(len(names), 1)))
    if len(bad):
        raise ShardError(path, f"subset id {int(table['subsets'][bad[0]])} beyond the "
                         f"{len(names)} subset names", int(bad[0]))
    if check_edges:
        check_edge_index(path, f, table["num_atoms"], table["edge_offsets"])
    return table


def shard_table(path: str | os.PathLike, check_edges: bool = True
                ) -> tuple[dict[str, np.ndarray], dict, dict]:
    """A shard's checked per-graph table (`read_table`), its attributes (`cutoff`,
    `subset_names`, `provenance` or None, `id`) and the stamp state (`file_state` and format)
    they hold for. A shard whose stamp matches it is read from the stamp alone; otherwise from
    the file, and stamped if its edges were checked."""
    state = _stamp_state(path)  # before the checks: a later change is seen at the next open
    stamped = _read_stamp(path, state)
    if stamped is not None:
        return (*stamped, state)
    with open_shard(path) as f, shard_errors(path):
        table = read_table(path, f, check_edges)
        cutoff = float(f.attrs["cutoff"])
        origin = json.loads(f.attrs["provenance"]) if "provenance" in f.attrs else None
        attrs = {"cutoff": cutoff, "subset_names": json.loads(f.attrs["subset_names"]),
                 "provenance": origin,
                 "id": origin["id"] if origin else provenance.table_id(table, f["energy"][:],
                                                                       cutoff)}
    if check_edges:
        _write_stamp(path, table, attrs, state)
    return table, attrs, state


def _stamp_path(path: str | os.PathLike) -> Path:
    return Path(f"{path}{VERIFIED_SUFFIX}")


def file_state(path: str | os.PathLike) -> dict:
    """What identifies a file's version: size, modification and change times, inode. A copy
    that keeps the modification time (cp -p, rsync -a, tar x) still gets a new change time and
    inode, and any write moves the change time."""
    info = os.stat(path)
    return {"bytes": info.st_size, "mtime_ns": info.st_mtime_ns, "ctime_ns": info.st_ctime_ns,
            "inode": info.st_ino}


def _stamp_state(path: str | os.PathLike) -> dict:
    return {"format_version": FORMAT_VERSION, **file_state(path)}


def verified(path: str | os.PathLike) -> bool:
    """True if the shard's edge indices passed the check as the file is now (its stamp matches
    its size and modification time)."""
    return _read_stamp(path, _stamp_state(path)) is not None


def _read_stamp(path: str | os.PathLike, state: dict
                ) -> tuple[dict[str, np.ndarray], dict] | None:
    """The table and attributes the stamp holds, if it was written for the shard in `state`
    (None for a missing, unreadable, older or mismatched stamp: the shard is then checked
    again)."""
    try:
        with np.load(_stamp_path(path), allow_pickle=False) as stamp:
            arrays = {k: stamp[k] for k in stamp.files}
        meta = json.loads(str(arrays.pop("meta")))
        if meta["state"] != state:
            return None
        return arrays, meta["attrs"]
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
        return None


def _write_stamp(path: str | os.PathLike, table: dict[str, np.ndarray], attrs: dict,
                 state: dict) -> None:
    """Record that the shard as it is now passed its checks, with its table and attributes,
    so that later opens read this small file alone (skipped on a read-only folder: the
    checks then run at every open)."""
    meta = json.dumps({"state": state, "attrs": attrs})
    with contextlib.suppress(OSError), atomic_path(_stamp_path(path)) as tmp, \
            open(tmp, "wb") as out:
        np.savez(out, meta=np.array(meta), **table)


def check_edge_index(path: str | os.PathLike, f: h5py.File, num_atoms: np.ndarray,
                     edge_offsets: np.ndarray) -> None:
    """Every edge's sender and receiver in [0, its graph's atom count): one vectorised pass
    over edge_index, in blocks of about CHECK_EDGES edges (also verifying their checksums)."""
    dataset = f["edge_index"]
    nonempty = np.flatnonzero(edge_offsets[1:] > edge_offsets[:-1])
    first = 0
    while first < len(nonempty):
        e0 = int(edge_offsets[nonempty[first]])
        last = int(np.searchsorted(edge_offsets[nonempty + 1], e0 + CHECK_EDGES, "right"))
        last = max(last, first + 1)
        block = nonempty[first:last]
        e1 = int(edge_offsets[block[-1] + 1])
        with shard_errors(path):
            indices = dataset[:, e0:e1]
        # as unsigned, a negative index is huge: one max per graph checks both bounds
        largest = np.maximum.reduceat(indices.view(np.uint32), edge_offsets[block] - e0,
                                      axis=1).max(axis=0)
        bad = np.flatnonzero(largest >= num_atoms[block])
        if len(bad):
            g = int(block[bad[0]])
            rows = indices[:, edge_offsets[g] - e0: edge_offsets[g + 1] - e0]
            value = int(rows[(rows < 0) | (rows >= num_atoms[g])][0])
            raise ShardError(path, f"edge index {value} out of range for its {num_atoms[g]} "
                             f"atoms; {REBUILD}", g)
        first = last


class GraphStore:
    """Read-only view of one shard file, a folder of `shard_*.h5` files, or a list of those
    (a union of data sets, in list order), indexed globally. Each shard is checked when opened
    (`read_table`); errors are ShardError naming the file and graph.

    `check_edges=False` skips the edge-index pass (about 14 ns an edge, the only check that
    reads more than the per-graph table, and run once per shard file: module docstring): for
    tools that read the table alone."""

    def __init__(self, path: str | os.PathLike | list[str | os.PathLike],
                 check_edges: bool = True):
        paths = list(path) if isinstance(path, (list, tuple)) else [path]
        self.path = Path(paths[0]) if len(paths) == 1 else tuple(map(Path, paths))
        self.files = [f for p in paths for f in shard_files(p)]
        self.shard_ids: list[str] = []
        self.origins: list[dict | None] = []  # per shard: its recorded provenance, if any
        names: list[str] = []
        atoms, edges, subsets, receivers = [], [], [], []
        self._atom_offsets, self._edge_offsets = [], []
        self.cutoff: float | None = None
        self.states: list[dict] = []  # per shard: its file_state when its table was read
        for file in self.files:
            table, attrs, state = shard_table(file, check_edges)
            self.states.append({k: v for k, v in state.items() if k != "format_version"})
            self._check_cutoff(file, attrs["cutoff"])
            local = attrs["subset_names"]
            self.origins.append(attrs["provenance"])
            self.shard_ids.append(attrs["id"])
            for n in local:
                if n not in names:
                    names.append(n)
            remap = np.array([names.index(n) for n in local] or [0], np.int16)
            atoms.append(table["num_atoms"])
            edges.append(table["num_edges"])
            receivers.append(table.get("num_receivers"))
            subsets.append(remap[table["subsets"]] if len(local) else table["subsets"])
            self._atom_offsets.append(table["atom_offsets"])
            self._edge_offsets.append(table["edge_offsets"])
        self.subset_names = names
        self.num_atoms = np.concatenate(atoms)
        self.num_edges = np.concatenate(edges)
        # atoms with an incoming edge per graph (None if a shard predates the count)
        self.num_receivers = (None if any(r is None for r in receivers)
                              else np.concatenate(receivers))
        self.subsets = np.concatenate(subsets)
        self._starts = np.concatenate([[0], np.cumsum([len(a) for a in atoms])])
        self._handles: dict[int, h5py.File] = {}
        self._pid = os.getpid()
        self._check_origins(paths)
        self.fingerprint = provenance.fingerprint(self.shard_ids)

    def _check_origins(self, paths: list) -> None:
        """The shards of one folder come from one conversion of one data set: their recorded
        data set and inputs agree (a shard copied in from elsewhere is refused, by name)."""
        k = 0
        for path in paths:
            first = None
            for file in shard_files(path):
                origin = self.origins[k]
                k += 1
                if origin is None:
                    continue
                key = (origin["dataset"], origin["inputs_sha256"])
                if first is None:
                    first = (file, key)
                elif key != first[1]:
                    raise ShardError(file, f"built from data set {key[0]!r} (inputs "
                                     f"{str(key[1])[:12]}), but {first[0].name} beside it from "
                                     f"{first[1][0]!r} (inputs {str(first[1][1])[:12]}): a shard "
                                     f"of another data set or conversion; {REBUILD}")

    def datasets(self) -> list[str | None]:
        """The data set each shard records (None for a shard written without provenance)."""
        return [o["dataset"] if o else None for o in self.origins]

    def _check_cutoff(self, file: Path, cutoff: float) -> None:
        if self.cutoff is not None and cutoff != self.cutoff:
            raise ShardError(file, f"cutoff {cutoff} differs from {self.cutoff}")
        self.cutoff = cutoff

    def __len__(self) -> int:
        return int(self._starts[-1])

    def shard_of(self, indices: np.ndarray) -> np.ndarray:
        """The shard (an index into `files`) of each of the graphs `indices`."""
        return np.searchsorted(self._starts, np.asarray(indices, np.int64), side="right") - 1

    def graph_blocks(self, indices: np.ndarray, fields: Iterable[str],
                     max_items: int = CHECK_EDGES) -> Iterator[tuple[np.ndarray, dict]]:
        """The fields of the graphs `indices` (unique) read in contiguous blocks, shard by
        shard: yields (positions of the selected graphs within the block, arrays), the arrays
        holding each field over the block's whole range of graphs (per-atom and per-edge fields
        concatenated, edge_index along axis 1), its `num_atoms` and `num_edges`, and `first`,
        the store index of its first graph. A block
        spans about `max_items` atoms plus edges (one graph at least): bounded memory, few
        large reads instead of one per graph."""
        indices = np.unique(np.asarray(indices, dtype=np.int64))
        shard_of = np.searchsorted(self._starts, indices, side="right") - 1
        for shard in np.unique(shard_of):
            local = indices[shard_of == shard] - self._starts[shard]
            atom_offsets, edge_offsets = self._atom_offsets[shard], self._edge_offsets[shard]
            items = atom_offsets + edge_offsets  # cumulative atoms + edges at each graph start
            f, start = self._handle(int(shard)), 0
            while start < len(local):
                first = int(local[start])
                stop = int(np.searchsorted(local, local[start] + 1, side="left"))
                limit = items[first] + max_items
                stop = max(stop, int(np.searchsorted(items[local + 1], limit, side="right")))
                last = int(local[stop - 1]) + 1
                a0, a1 = int(atom_offsets[first]), int(atom_offsets[last])
                e0, e1 = int(edge_offsets[first]), int(edge_offsets[last])
                arrays = {"first": self._starts[shard] + first,
                          "num_atoms": np.diff(atom_offsets[first:last + 1]),
                          "num_edges": np.diff(edge_offsets[first:last + 1])}
                with shard_errors(self.files[shard]):
                    for name in fields:
                        if name == "edge_index":
                            arrays[name] = f[name][:, e0:e1]
                        elif name == "unit_shifts":
                            arrays[name] = f[name][e0:e1]
                        elif name in ATOM_FIELDS:
                            arrays[name] = f[name][a0:a1]
                        else:
                            arrays[name] = f[name][first:last]
                yield local[start:stop] - first, arrays
                start = stop

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_handles": {}}

    def _handle(self, shard: int) -> h5py.File:
        if os.getpid() != self._pid:  # forked worker: never reuse the parent's handles
            self._handles, self._pid = {}, os.getpid()
        if shard not in self._handles:
            self._handles[shard] = open_shard(self.files[shard], self.states[shard])
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
        with shard_errors(self.files[shard], local):
            graph = {k: f[k][a0:a1] for k in ATOM_FIELDS}
            graph["edge_index"] = f["edge_index"][:, e0:e1].astype(np.int64)
            graph["unit_shifts"] = f["unit_shifts"][e0:e1].astype(np.int32)
            for k in ("cell", "pbc", "energy"):
                graph[k] = f[k][local]
            if f["has_stress"][local]:
                graph["stress"] = f["stress"][local]
        graph["numbers"] = graph["numbers"].astype(np.int64)
        graph["energy"] = float(graph["energy"])
        graph["subset"] = self.subset_names[int(self.subsets[index])]
        return graph

    def close(self) -> None:
        """Close the file handles this process opened."""
        for h in self._handles.values():
            h.close()
        self._handles = {}
