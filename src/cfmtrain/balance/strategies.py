"""Batching strategies with one interface: Algorithm 1 (randomised per epoch) and its peers.

`strategy(sizes, capacity, num_ranks, *, seed, epoch, **options) -> Plan`; `seed=None` means no
shuffling. Each peer follows its project's source (read for this module, not copied):
  fixed_count  torch DistributedSampler + BatchSampler (the MACE / PyG default)
  lpt          fairchem BalancedBatchSampler (src/fairchem/core/common/data_parallel.py)
  max_atoms    fairchem MaxAtomDistributedBatchSampler (datasets/samplers/
               max_atom_distributed_sampler.py); PyG DynamicBatchSampler is the same greedy loop
  ffd          first-fit decreasing (Garey and Johnson), steps formed as for Algorithm 1
  hydragnn     HydraGNN DistributedCostAwareBatchSampler (hydragnn/preprocess/batch_sampler.py)
Random streams are numpy's (seeded by (seed, epoch)), not torch's: same semantics, other draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from cfmtrain.balance.pack import (
    Oversize,
    as_sizes,
    check_oversize,
    descending_order,
    finalize,
    kernel,
    pack_plan,
)
from cfmtrain.balance.plan import Plan


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The random stream of one epoch, identical on every rank."""
    return np.random.default_rng([int(seed), int(epoch)])


def quantize_up(sizes: np.ndarray, tolerance: float) -> np.ndarray:
    """Sizes rounded up to a geometric grid of ratio 1 + tolerance, so near-equal sizes tie."""
    if tolerance <= 0:
        return sizes
    positive = np.maximum(sizes.astype(np.float64), 1e-300)
    grid = np.exp(np.ceil(np.log(positive) / np.log1p(tolerance)) * np.log1p(tolerance))
    grid = np.where(sizes > 0, np.maximum(grid, sizes), 0.0)
    return np.ceil(grid).astype(np.int64) if sizes.dtype == np.int64 else grid


def algorithm1(sizes, capacity: float, num_ranks: int, *, seed: int | None = None,
               epoch: int = 0, oversize: Oversize = "error", tolerance: float = 0.0,
               refine: bool = True) -> Plan:
    """The paper's Algorithm 1 (with our refinement of its leftovers unless `refine=False`, see
    `pack_plan`); with a seed, randomised per epoch while keeping the balance.

    Ties among equal sizes (after rounding sizes up to a grid of relative step `tolerance`, which
    costs at most that fraction of balance) are broken at random, bins of equal load are
    exchanged at random between steps (`mix_equal_loads`), then steps are shuffled and the bins
    of a step dealt to random ranks. Loads per step are those of the deterministic run.
    """
    sizes = as_sizes(sizes)
    if seed is None:
        return pack_plan(sizes, capacity, num_ranks, oversize=oversize, refine=refine)
    rng = epoch_rng(seed, epoch)
    packed = sizes
    if tolerance > 0:  # rounded up, but never past the capacity a graph fits in
        packed = quantize_up(sizes, tolerance)
        packed = np.where(sizes <= capacity, np.minimum(packed, capacity), sizes).astype(
            packed.dtype)
    plan = pack_plan(packed, capacity, num_ranks, oversize=oversize, rng=rng, refine=refine)
    return mix_equal_loads(plan, sizes, rng).shuffled_steps(rng)


def mix_equal_loads(plan: Plan, sizes: np.ndarray, rng: np.random.Generator) -> Plan:
    """The plan with bins of equal load exchanged at random across steps: every step keeps its
    loads (so its balance), but bins built in a row from alike graphs (a 54-atom cell topped up
    with dimers, twice) no longer meet in one step. Steps made only of one kind of structure
    slowed the energy's learning on mixed data (docs/accuracy.md)."""
    loads = plan.loads(sizes)
    slots = np.lexsort((np.arange(len(loads)), loads))  # bin positions grouped by load
    bins = np.lexsort((rng.random(len(loads)), loads))  # the same groups, in random order
    order = np.empty(len(loads), np.int64)
    order[slots] = bins
    return plan.reordered(order)


def matched_batch(sizes: np.ndarray, capacity: float) -> int:
    """Graphs per batch whose mean load equals the capacity (the default fixed count)."""
    return max(1, round(capacity / max(float(np.mean(sizes)), 1e-12))) if len(sizes) else 1


def _distributed_indices(n: int, num_ranks: int, rng) -> np.ndarray:
    """torch DistributedSampler: (shuffled) indices padded by repetition to a multiple of R,
    returned as an (R, n/R) array whose row r is rank r's `indices[r::R]`."""
    indices = rng.permutation(n) if rng is not None else np.arange(n)
    per_rank = math.ceil(n / num_ranks)
    return np.resize(indices, per_rank * num_ranks).reshape(per_rank, num_ranks).T


def _step_major(per_rank: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's consecutive chunks of `batch` graphs, laid out step by step: (flat, counts)."""
    num_ranks, m = per_rank.shape
    full = m // batch
    head = per_rank[:, :full * batch].reshape(num_ranks, full, batch).transpose(1, 0, 2).ravel()
    tail = per_rank[:, full * batch:].ravel()
    counts = [batch] * (full * num_ranks) + ([m - full * batch] * num_ranks if len(tail) else [])
    return np.concatenate([head, tail]), np.asarray(counts, np.int64)


def _csr(flat: np.ndarray, counts: np.ndarray, num_ranks: int) -> Plan:
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Plan(np.asarray(flat, np.int64), offsets, num_ranks)


def _fixed_count_batches(sizes: np.ndarray, capacity: float, num_ranks: int, seed: int | None,
                         epoch: int, graphs_per_batch: int | None
                         ) -> tuple[np.ndarray, np.ndarray]:
    """DistributedSampler + BatchSampler's batches, step-major: (graph ids, graphs per batch)."""
    batch = graphs_per_batch or matched_batch(sizes, capacity)
    rng = epoch_rng(seed, epoch) if seed is not None else None
    return _step_major(_distributed_indices(len(sizes), num_ranks, rng), batch)


def fixed_count(sizes, capacity: float, num_ranks: int, *, seed: int | None = None,
                epoch: int = 0, graphs_per_batch: int | None = None) -> Plan:
    """A fixed number of graphs per batch, sizes ignored (DistributedSampler + BatchSampler)."""
    sizes = as_sizes(sizes)
    if not len(sizes):
        return _csr(np.zeros(0, np.int64), np.zeros(0, np.int64), num_ranks)
    return _csr(*_fixed_count_batches(sizes, capacity, num_ranks, seed, epoch, graphs_per_batch),
                num_ranks)


def lpt(sizes, capacity: float, num_ranks: int, *, seed: int | None = None, epoch: int = 0,
        graphs_per_batch: int | None = None) -> Plan:
    """fairchem BalancedBatchSampler: every step gathers the R fixed-count batches and splits
    their graphs over the ranks by longest-processing-time-first (largest to the lightest rank)."""
    sizes = as_sizes(sizes)
    if not len(sizes):
        return _csr(np.zeros(0, np.int64), np.zeros(0, np.int64), num_ranks)
    flat, counts = _fixed_count_batches(sizes, capacity, num_ranks, seed, epoch, graphs_per_batch)
    group_counts = counts.reshape(-1, num_ranks).sum(axis=1)
    group_offsets = np.concatenate([[0], np.cumsum(group_counts)]).astype(np.int64)
    fn, typed, _ = kernel("lpt_groups", sizes, 1)
    return Plan(*fn(typed, flat, group_offsets, num_ranks), num_ranks)


def _next_fit(sizes: np.ndarray, order: np.ndarray, capacity: float, max_graphs: int = 0):
    fn, typed, cap = kernel("next_fit", sizes, capacity)
    flat, offsets = fn(typed, np.asarray(order, np.int64), cap, max_graphs)
    return Plan(flat, offsets, 1)


def max_atoms(sizes, capacity: float, num_ranks: int, *, seed: int | None = None,
              epoch: int = 0, oversize: Oversize = "error",
              repack_every_epoch: bool = False) -> Plan:
    """fairchem MaxAtomDistributedBatchSampler: graphs in random order (from `seed` alone) filled
    greedily up to the capacity, once; each epoch shuffles the batch order, pads it to a multiple
    of R by repeating batches and deals batch s*R + r to rank r. `repack_every_epoch` draws the
    graph order from (seed, epoch) instead, as PyG's DynamicBatchSampler does."""
    sizes = as_sizes(sizes)
    check_oversize(sizes, capacity, oversize)
    pack_seed = 0 if seed is None else seed
    pack_rng = (epoch_rng(pack_seed, epoch) if repack_every_epoch
                else np.random.default_rng(pack_seed))
    batches = _next_fit(sizes, pack_rng.permutation(len(sizes)), capacity)
    ids = np.arange(len(batches))
    if seed is not None:
        ids = epoch_rng(seed, epoch).permutation(len(batches))
    return batches.reordered(np.resize(ids, -(-len(ids) // num_ranks) * num_ranks), num_ranks)


def ffd(sizes, capacity: float, num_ranks: int, *, seed: int | None = None, epoch: int = 0,
        oversize: Oversize = "error") -> Plan:
    """First-fit decreasing, then steps formed as for Algorithm 1 (a multiple of R, by load);
    with a seed, random ties and shuffled steps as for Algorithm 1."""
    sizes = as_sizes(sizes)
    big = check_oversize(sizes, capacity, oversize)
    rng = epoch_rng(seed, epoch) if seed is not None else None
    order = descending_order(sizes, np.flatnonzero(sizes <= capacity), rng)
    fn, typed, cap = kernel("first_fit", sizes, capacity)
    flat, offsets = fn(typed, order, cap)
    flat = np.concatenate([flat, big])
    offsets = np.concatenate([offsets, offsets[-1] + np.arange(1, len(big) + 1)])
    plan = finalize(flat, offsets, sizes, num_ranks)
    return plan.shuffled_steps(rng) if rng is not None else plan


def hydragnn(sizes, capacity: float, num_ranks: int, *, seed: int | None = None,
             epoch: int = 0, oversize: Oversize = "error", max_graphs: int | None = None) -> Plan:
    """HydraGNN DistributedCostAwareBatchSampler: graphs shuffled from seed + epoch, filled
    greedily up to the capacity (and `max_graphs`); batches padded to a multiple of R by repeating
    the first ones, sorted by cost, grouped R per step; steps shuffled; rank r takes member
    (r + step) % R of each step."""
    sizes = as_sizes(sizes)
    check_oversize(sizes, capacity, oversize)
    rng = epoch_rng(seed, epoch) if seed is not None else None
    order = rng.permutation(len(sizes)) if rng is not None else np.arange(len(sizes))
    batches = _next_fit(sizes, order, capacity, max_graphs or 0)
    count = len(batches)
    if not count:
        return batches.reordered(np.zeros(0, np.int64), num_ranks)
    ids = np.concatenate([np.arange(count), np.arange(-count % num_ranks) % count])
    ids = ids[np.argsort(batches.loads(sizes)[ids], kind="stable")]
    steps = ids.reshape(-1, num_ranks)
    if rng is not None:
        steps = steps[rng.permutation(len(steps))]
    rotation = (np.arange(num_ranks)[None, :] + np.arange(len(steps))[:, None]) % num_ranks
    dealt = np.take_along_axis(steps, rotation, axis=1).ravel()
    return batches.reordered(dealt, num_ranks)


Strategy = Callable[..., Plan]
STRATEGIES: dict[str, Strategy] = {
    "algorithm1": algorithm1,
    "fixed_count": fixed_count,
    "lpt": lpt,
    "max_atoms": max_atoms,
    "ffd": ffd,
    "hydragnn": hydragnn,
}


def get_strategy(name: str) -> Strategy:
    """The strategy registered under `name` (a ValueError listing the known ones otherwise)."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {sorted(STRATEGIES)}") from None
