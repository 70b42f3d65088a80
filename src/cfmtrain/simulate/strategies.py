"""Batching strategies as schedule functions (sizes, ranks) -> Schedule: the fixed graph count of
the baseline, and the packing strategies of cfmtrain.balance (Algorithm 1 and its peers)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cfmtrain.balance.pack import pack_plan
from cfmtrain.simulate.schedule import Schedule, bins_schedule, fixed_count_schedule
from cfmtrain.simulate.sizes import Sizes

ScheduleFn = Callable[[Sizes, int], Schedule]


def fixed_count(graphs_per_batch: int, seed: int = 0) -> ScheduleFn:
    """The baseline: a fixed number of graphs per rank and step (DistributedSampler)."""
    def schedule(sizes: Sizes, ranks: int) -> Schedule:
        return fixed_count_schedule(sizes, ranks, graphs_per_batch, seed)
    return schedule


def to_csr(bins) -> tuple[np.ndarray, np.ndarray]:
    """Bins as (flat, offsets), from a Plan (flat, offsets attributes) or a list of index lists."""
    if hasattr(bins, "flat") and hasattr(bins, "offsets"):
        return np.asarray(bins.flat, np.int64), np.asarray(bins.offsets, np.int64)
    lengths = np.fromiter((len(b) for b in bins), np.int64, len(bins))
    flat = np.concatenate([np.asarray(b, np.int64) for b in bins]) if len(bins) else \
        np.zeros(0, np.int64)
    return flat, np.concatenate([[0], np.cumsum(lengths)])


def packed(strategy: str, capacity: int, seed: int = 0, size: str = "atoms") -> ScheduleFn:
    """A cfmtrain.balance packing strategy (e.g. algorithm1) at a capacity in atoms (or edges)."""
    pack = packer(strategy)

    def schedule(sizes: Sizes, ranks: int) -> Schedule:
        weights = sizes.atoms if size == "atoms" else sizes.edges
        flat, offsets = to_csr(pack(weights, capacity, ranks, seed))
        return bins_schedule(sizes, flat, offsets, ranks)
    return schedule


def packer(strategy: str) -> Callable[[np.ndarray, int, int, int], object]:
    """The balancer's packing function for `strategy`: (sizes, capacity, ranks, seed) -> bins
    (a cfmtrain.balance Plan, bin s*R + r being rank r's batch at step s)."""
    if strategy == "algorithm1":
        return lambda sizes, capacity, ranks, seed: pack_plan(sizes, capacity, ranks,
                                                              oversize="own_bin")
    raise ValueError(f"unknown batching strategy {strategy!r}; known: algorithm1")
