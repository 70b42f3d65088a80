"""Which graphs each rank trains on at each step: a (steps x ranks) table of batch sizes.

Fixed count follows torch's DistributedSampler (pad to a multiple of R, rank r takes every R-th
index, then consecutive batches); bin strategies hand bin k to step k // R, rank k % R.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cfmtrain.simulate.sizes import Sizes


@dataclasses.dataclass
class Schedule:
    """Atoms, edges and graphs of the batch of every (step, rank); graphs == 0 means idle."""

    atoms: np.ndarray  # (steps, ranks) int64
    edges: np.ndarray
    graphs: np.ndarray

    @property
    def steps(self) -> int:
        return self.atoms.shape[0]

    @property
    def ranks(self) -> int:
        return self.atoms.shape[1]


def fixed_count_schedule(sizes: Sizes, ranks: int, graphs_per_batch: int, seed: int = 0,
                         order: np.ndarray | None = None) -> Schedule:
    """DistributedSampler(drop_last=False) + DataLoader(batch_size=graphs_per_batch) over a
    seeded permutation of the graphs (or over `order`, for tests against torch's sampler)."""
    if ranks < 1 or graphs_per_batch < 1:
        raise ValueError(f"fixed count: ranks and graphs_per_batch must be >= 1, got {ranks}, "
                         f"{graphs_per_batch}")
    n = len(sizes.atoms)
    perm = np.random.default_rng(seed).permutation(n) if order is None else np.asarray(order)
    per_rank = -(-n // ranks)
    padded = np.resize(perm, per_rank * ranks)  # repeats from the start, as DistributedSampler
    grid = padded.reshape(per_rank, ranks)  # row i: the i-th sample of every rank
    starts = np.arange(0, per_rank, graphs_per_batch)
    counts = np.diff(np.append(starts, per_rank))
    atoms = np.add.reduceat(sizes.atoms[grid], starts, axis=0)
    edges = np.add.reduceat(sizes.edges[grid], starts, axis=0)
    graphs = np.repeat(counts[:, None], ranks, axis=1)
    return Schedule(atoms.astype(np.int64), edges.astype(np.int64), graphs.astype(np.int64))


def bins_schedule(sizes: Sizes, flat: np.ndarray, offsets: np.ndarray, ranks: int) -> Schedule:
    """Bins in CSR form (bin k = flat[offsets[k]:offsets[k+1]]) dealt out step-major."""
    flat, offsets = np.asarray(flat, np.int64), np.asarray(offsets, np.int64)
    if offsets[0] != 0 or offsets[-1] != len(flat) or np.any(np.diff(offsets) < 0):
        raise ValueError("bins: offsets must start at 0, end at len(flat) and not decrease")
    nbins = len(offsets) - 1
    counts = np.diff(offsets)
    atoms = _bin_sums(sizes.atoms[flat], offsets)
    edges = _bin_sums(sizes.edges[flat], offsets)
    steps = -(-nbins // ranks)
    pad = steps * ranks - nbins

    def grid(values: np.ndarray) -> np.ndarray:
        return np.concatenate([values, np.zeros(pad, np.int64)]).reshape(steps, ranks)

    return Schedule(grid(atoms), grid(edges), grid(counts))


def _bin_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Sum of each CSR segment; empty segments sum to 0."""
    cums = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    return cums[offsets[1:]] - cums[offsets[:-1]]
