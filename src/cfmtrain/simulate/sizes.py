"""Graph-size distributions for the simulator: a configured data set's GraphStore, or the paper's
Table 3 mixture (2.65M graphs) as cfmtrain.balance.mixture draws it, with measured edges per atom.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cfmtrain.balance.mixture import ROWS, mixture_sizes
from cfmtrain.paper import PAPER_GRAPHS


@dataclasses.dataclass
class Sizes:
    """Atoms and edges per graph, with the subset of each graph."""

    atoms: np.ndarray
    edges: np.ndarray
    subsets: np.ndarray
    subset_names: list[str]
    description: str

    def __post_init__(self) -> None:
        n = len(self.atoms)
        if n == 0 or len(self.edges) != n or len(self.subsets) != n:
            raise ValueError(f"sizes ({self.description}): need equal, non-empty arrays, got "
                             f"{len(self.atoms)} atoms, {len(self.edges)} edges, "
                             f"{len(self.subsets)} subsets")
        if self.atoms.min() < 1 or self.edges.min() < 0:
            raise ValueError(f"sizes ({self.description}): graphs need >= 1 atom, >= 0 edges")

    def take(self, index: np.ndarray, description: str) -> Sizes:
        """The graphs at `index`."""
        return Sizes(self.atoms[index], self.edges[index], self.subsets[index], self.subset_names,
                     description)

    def nested(self, count: int, seed: int) -> Sizes:
        """The first `count` graphs of a seeded permutation: nested subsets for weak scaling."""
        order = np.random.default_rng(seed).permutation(len(self.atoms))[:count]
        return self.take(np.sort(order), f"{count:,} graphs of {self.description}")


def store_sizes(paths: list[str]) -> Sizes:
    """The per-graph table of a GraphStore (one folder, or several as a union)."""
    from cfmtrain.graphs.store import GraphStore  # lazy: h5py, torch; light command

    store = GraphStore(paths if len(paths) > 1 else paths[0], check_edges=False)
    return Sizes(np.asarray(store.num_atoms, np.int64), np.asarray(store.num_edges, np.int64),
                 np.asarray(store.subsets, np.int64), list(store.subset_names),
                 f"graph store {' + '.join(map(str, paths))}")


def neighbours_per_atom(sizes: Sizes) -> dict[str, float]:
    """Edges per atom of each subset present in `sizes`."""
    out = {}
    for sid, name in enumerate(sizes.subset_names):
        mask = sizes.subsets == sid
        if mask.any():
            out[name] = float(sizes.edges[mask].sum() / sizes.atoms[mask].sum())
    return out


def table3_mixture(neighbours: dict[str, float], total: int = PAPER_GRAPHS,
                   seed: int = 0) -> Sizes:
    """The paper's Table 3 mixture of `total` graphs, atoms drawn by cfmtrain.balance.mixture
    (the project's one definition: uniform in each subset's range, MPtrj log-normal); edges are
    atoms times the subset's measured edges per atom (`neighbours`, keyed by mini's subset names,
    the keys of cfmtrain.paper.TABLE3).
    """
    names = [row.key for row in ROWS]
    missing = [name for name in names if name not in neighbours]
    if missing:
        raise ValueError(f"Table 3 mixture: no edges-per-atom for subsets {missing}; build the "
                         "graphs of a data set that has them (e.g. mini)")
    atoms, subsets = mixture_sizes(total, seed)
    per_atom = np.array([neighbours[n] for n in names])
    edges = np.rint(atoms * per_atom[subsets]).astype(np.int64)
    return Sizes(atoms, edges, subsets, names, f"Table 3 mixture, {len(atoms):,} graphs")
