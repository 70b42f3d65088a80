"""Labelled frames of a file (any format cfmtrain reads; labels found as for own data) as a
one-shard graph store at a model's cutoff, for `cfmtrain evaluate --frames`."""

from __future__ import annotations

from pathlib import Path

from cfmtrain.frames.keys import LabelKeys, config_type_of, own_frame
from cfmtrain.frames.neighbors import radius_graph
from cfmtrain.frames.validate import InvalidFrameError, frame_labels
from cfmtrain.graphs.store import GraphStore, write_shard
from cfmtrain.readers.own import ISOLATED_TYPES, read_atoms


def frames_store(path: Path, keys: LabelKeys, cutoff: float, folder: Path) -> GraphStore:
    """The labelled frames of `path` (isolated atoms left out: they give E0s, not errors) as
    radius graphs at `cutoff` in a shard under `folder`; a frame without labels is an error
    naming the file and the frame."""
    graphs = []
    for source, index, atoms in read_atoms(path):
        if config_type_of(atoms, keys) in ISOLATED_TYPES:
            continue
        frame = own_frame(atoms, source, index, keys)
        if frame.problem is not None:
            raise InvalidFrameError(source, index, *frame.problem)
        try:
            energy, forces, stress = frame_labels(frame)
        except Exception as err:  # frame_labels' own problem: reason and detail
            raise InvalidFrameError(source, index, *getattr(err, "args", (str(err), ""))[:2]
                                    ) from None
        graph = radius_graph(frame.positions, frame.cell, frame.pbc, cutoff)
        graphs.append({"positions": frame.positions, "numbers": frame.numbers,
                       "cell": frame.cell, "pbc": frame.pbc, "edge_index": graph.edge_index,
                       "unit_shifts": graph.unit_shifts, "energy": energy, "forces": forces,
                       "stress": stress,
                       "subset": str(frame.info.get("config_type") or Path(source).stem),
                       "source_index": len(graphs)})
    if not graphs:
        raise ValueError(f"{path}: no labelled frames to evaluate (isolated atoms left out)")
    folder.mkdir(parents=True, exist_ok=True)
    write_shard(folder / "shard_0000.h5", graphs, cutoff=cutoff)
    return GraphStore(folder)
