"""The training batch sampler of each variant, from cfmtrain.balance: a fixed graph count
(baseline, kernel, matched) or Algorithm 1 with a capacity (balancer, both).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from cfmtrain.balance import DistributedBinPackSampler
from cfmtrain.paper import variant
from cfmtrain.train.capacity import Capacity, resolve_capacity
from cfmtrain.train.config import TrainConfig


def _sampler(sizes: np.ndarray, capacity: Capacity, cfg: TrainConfig, rank: int,
             world_size: int, strategy: str, **options):
    if strategy == "algorithm1" and capacity.source == "auto":
        options["oversize"] = "own_bin"  # auto: a graph above the capacity gets its own bin
    return DistributedBinPackSampler(sizes, capacity.value, world_size, rank, seed=cfg.seed,
                                     shuffle=True, strategy=strategy, with_weights=True,
                                     **options)


def matched_graphs_per_batch(sizes: np.ndarray, capacity: Capacity, cfg: TrainConfig,
                             world_size: int) -> int:
    """The fixed graph count with the balancer's mean load per batch: graphs / bins of
    Algorithm 1 at this capacity and rank count (so also about the same number of steps)."""
    bins = len(_sampler(sizes, capacity, cfg, 0, world_size, "algorithm1").plan)
    return max(1, int(round(len(sizes) / max(1, bins))))


def make_train_sampler(cfg: TrainConfig, num_atoms: np.ndarray, num_edges: np.ndarray,
                       rank: int, world_size: int) -> tuple[object, Capacity]:
    """This rank's batch sampler over positions 0..len(num_atoms)-1 of the training set,
    computed identically on every rank from (sizes, seed, epoch), yielding (index, weight);
    and the balancer capacity the run uses (config `batch.capacity`, `auto` resolved)."""
    sizes = num_atoms if cfg.batch.size == "atoms" else num_edges
    capacity, warning = resolve_capacity(cfg.batch.capacity, sizes, cfg.batch.graphs_per_batch,
                                         world_size, cfg.batch.size)
    if warning and rank == 0 and cfg.balanced:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    if cfg.balanced:
        return _sampler(sizes, capacity, cfg, rank, world_size, "algorithm1"), capacity
    count = cfg.batch.graphs_per_batch
    if variant(cfg.variant).matched:
        count = matched_graphs_per_batch(sizes, capacity, cfg, world_size)
    return (_sampler(sizes, capacity, cfg, rank, world_size, "fixed_count",
                     graphs_per_batch=count), capacity)


def loss_normalizers(counts: torch.Tensor, epoch_mean: bool) -> torch.Tensor:
    """[steps, 2] graphs and atoms each step's loss is divided by: the step's own counts, or with
    `epoch_mean` the epoch's mean per step in every row, so that the epoch's summed loss weighs
    every graph's energy and every atom's forces alike however the graphs are batched into its
    steps (each graph's energy as fixed-count batches of as many steps weigh it)."""
    if not epoch_mean or not len(counts):
        return counts
    return counts.mean(dim=0, keepdim=True).expand_as(counts).contiguous()


def global_step_counts(sampler, num_atoms: np.ndarray) -> torch.Tensor:
    """[steps, 2]: graphs and atoms of each step over all ranks, from the epoch's plan (which
    every rank holds); padding copies (weight 0) are not counted."""
    plan = sampler.plan
    weights = plan.weights(len(num_atoms))
    per_graph = np.stack([weights, weights * num_atoms[plan.flat]], axis=1)
    cumulative = np.concatenate([np.zeros((1, 2)), np.cumsum(per_graph, axis=0)])
    per_bin = cumulative[plan.offsets[1:]] - cumulative[plan.offsets[:-1]]
    steps = per_bin.reshape(-1, plan.num_ranks, 2).sum(axis=1)
    return torch.from_numpy(steps)
