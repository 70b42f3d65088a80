"""DistributedBinPackSampler: a DDP batch sampler whose plan every rank computes identically from
(sizes, seed, epoch), with resume mid-epoch and zero weights for padding copies.
"""

from __future__ import annotations

import copy
import hashlib
import warnings
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from cfmtrain.balance.pack import as_sizes
from cfmtrain.balance.plan import Plan
from cfmtrain.balance.strategies import get_strategy


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


class DistributedBinPackSampler(Sampler[list[int]]):
    """Yields this rank's batches (lists of dataset indices) for one epoch.

    The epoch's plan comes from `strategy` (default: Algorithm 1 with our refinements, see
    `pack_bins`, randomised from (seed, epoch) when `shuffle`; deterministic batches when not;
    `refine=False` among the options gives the paper's Algorithm 1 alone). When there are fewer
    graphs than bins, empty bins are filled with copies the DistributedSampler way; a copy has
    weight 0 (`batch_weights`, or `with_weights=True` to yield (index, weight) pairs for
    `PaddingWeightedDataset`), `padding_copies` counts them per epoch and rank 0 warns once (the
    first epoch that has any; the count changes little between epochs). `drop_last` drops the
    steps holding copies instead.
    """

    def __init__(self, sizes, capacity: float, num_replicas: int | None = None,
                 rank: int | None = None, *, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = False, strategy: str = "algorithm1",
                 with_weights: bool = False, **strategy_options) -> None:
        world, own_rank = _world()
        self.num_replicas = world if num_replicas is None else int(num_replicas)
        self.rank = own_rank if rank is None else int(rank)
        if self.num_replicas < 1 or not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank {self.rank} is not in [0, num_replicas={self.num_replicas})")
        self.sizes = as_sizes(sizes)
        self.capacity = capacity
        self.seed, self.shuffle, self.drop_last = int(seed), bool(shuffle), bool(drop_last)
        self.strategy = strategy
        self.strategy_options = dict(strategy_options)
        self._strategy = get_strategy(strategy)
        self.with_weights = with_weights
        self.epoch = 0
        self._start_step = 0
        self._yielded = 0
        self._cache: tuple[int, Plan, np.ndarray] | None = None
        self.padding_copies = 0
        self._warned = self.rank != 0  # padding copies are said once, by rank 0

    def _plan(self) -> tuple[Plan, np.ndarray]:
        """The epoch's plan as run (padded, maybe with steps dropped) and per-position weights."""
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1], self._cache[2]
        plan = self._strategy(self.sizes, self.capacity, self.num_replicas,
                              seed=self.seed if self.shuffle else None, epoch=self.epoch,
                              **self.strategy_options)
        plan, _ = plan.padded()
        weights = plan.weights(len(self.sizes))
        copies = int((weights == 0).sum() + (plan.counts == 0).sum())
        if copies and self.drop_last:
            bad = np.zeros(len(plan), bool)
            bad[np.repeat(np.arange(len(plan)), plan.counts)[weights == 0]] = True
            bad |= plan.counts == 0
            keep = ~bad.reshape(-1, self.num_replicas).any(axis=1)
            plan = plan.reordered(np.flatnonzero(np.repeat(keep, self.num_replicas)))
            weights = plan.weights(len(self.sizes))
            copies = 0
        elif copies and not self._warned:
            self._warned = True
            warnings.warn(f"DistributedBinPackSampler: epoch {self.epoch} has {copies} padding "
                          f"copies (graphs repeated so that every rank has a batch at every step, "
                          f"as DistributedSampler does); they carry weight 0. Said once per run; "
                          f"`padding_copies` counts them per epoch", stacklevel=3)
        self.padding_copies = copies
        self._cache = (self.epoch, plan, weights)
        return plan, weights

    @property
    def plan(self) -> Plan:
        """The whole epoch's plan (every rank's batches), as this sampler runs it."""
        return self._plan()[0]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (the plan derives from (seed, epoch)); a new epoch starts at step 0."""
        if int(epoch) != self.epoch:
            self.epoch, self._start_step, self._yielded = int(epoch), 0, 0

    def __len__(self) -> int:
        return self._plan()[0].num_steps

    def _bounds(self, step: int) -> tuple[int, int]:
        plan = self._plan()[0]
        k = step * self.num_replicas + self.rank
        return int(plan.offsets[k]), int(plan.offsets[k + 1])

    def batch_weights(self, step: int) -> np.ndarray:
        """Per-index loss weights of this rank's batch at `step` (0 for padding copies)."""
        start, stop = self._bounds(step)
        return self._plan()[1][start:stop]

    def __iter__(self) -> Iterator[list]:
        plan, weights = self._plan()
        start, self._start_step = self._start_step, 0
        for step in range(start, plan.num_steps):
            a, b = self._bounds(step)
            self._yielded = step + 1
            indices = plan.flat[a:b].tolist()
            yield list(zip(indices, weights[a:b].tolist(), strict=True)) if self.with_weights \
                else indices

    def _identity(self) -> dict:
        options = repr(sorted(self.strategy_options.items()))
        return {"sizes_sha1": hashlib.sha1(self.sizes.tobytes()).hexdigest(),
                "capacity": self.capacity, "num_replicas": self.num_replicas,
                "seed": self.seed, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "strategy": self.strategy, "options": options}

    def state_dict(self, steps_done: int | None = None) -> dict:
        """Epoch and step to resume from. With a prefetching DataLoader the sampler runs ahead of
        training: pass `steps_done`, the number of this epoch's steps actually trained."""
        step = self._yielded if steps_done is None else int(steps_done)
        return {"epoch": self.epoch, "step": step, **self._identity()}

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration starts at state['step'] of state['epoch']."""
        mine = self._identity()
        differs = [k for k in mine if state.get(k) != mine[k]]
        if differs:
            raise ValueError(f"DistributedBinPackSampler.load_state_dict: the state was saved with "
                             f"other {', '.join(differs)}; resuming would change the batches")
        self.epoch, self._start_step, self._yielded = int(state["epoch"]), int(state["step"]), \
            int(state["step"])


class PaddingWeightedDataset(Dataset):
    """For `with_weights=True`: item (index, weight) -> dataset[index] with its `weight` field
    (MACE's AtomicData per-graph loss weight) multiplied by weight, on a copy."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        index, weight = key
        item = self.dataset[index]
        if weight == 1.0:
            return item
        if not hasattr(item, "weight"):
            raise TypeError(f"PaddingWeightedDataset: item {index} ({type(item).__name__}) has no "
                            f"`weight` field to scale")
        item = item.clone() if hasattr(item, "clone") else copy.copy(item)
        item.weight = item.weight * weight
        return item
