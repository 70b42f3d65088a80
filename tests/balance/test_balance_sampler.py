"""DistributedBinPackSampler: every rank's share, resume mid-epoch, epochs, padding weights."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from cfmtrain.balance import STRATEGIES, DistributedBinPackSampler, PaddingWeightedDataset
from cfmtrain.balance.mixture import mixture_sizes

SIZES, _ = mixture_sizes(5000, seed=9)


class Item:
    """A MACE-like data item: a per-graph loss `weight` and `clone()`."""

    def __init__(self, n: int, weight: float = 1.0) -> None:
        self.n, self.weight = n, torch.tensor(weight)

    def clone(self) -> Item:
        return Item(self.n, float(self.weight))


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.filterwarnings("ignore:DistributedBinPackSampler")
def test_ranks_share_the_epoch(strategy):
    samplers = [DistributedBinPackSampler(SIZES, 3072, 4, r, seed=3, strategy=strategy)
                for r in range(4)]
    per_rank = [list(sampler) for sampler in samplers]
    assert len({len(batches) for batches in per_rank}) == 1  # same number of steps everywhere
    weight = np.zeros(len(SIZES))
    for rank, sampler in enumerate(samplers):
        for step, batch in enumerate(per_rank[rank]):
            np.add.at(weight, batch, sampler.batch_weights(step))
    assert np.all(weight == 1.0)  # every graph trained once per epoch, copies weighted 0


def test_epochs_differ_and_repeat_from_seed():
    sampler = DistributedBinPackSampler(SIZES, 3072, 2, 1, seed=5)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    again = DistributedBinPackSampler(SIZES, 3072, 2, 1, seed=5)
    again.set_epoch(1)
    assert list(again) == second and second != first
    assert len(sampler) == len(second)
    fixed = DistributedBinPackSampler(SIZES, 3072, 2, 1, shuffle=False)
    e0 = list(fixed)
    fixed.set_epoch(7)
    assert list(fixed) == e0  # the paper's deterministic batches


def test_resume_mid_epoch():
    sampler = DistributedBinPackSampler(SIZES, 3072, 4, 2, seed=1)
    sampler.set_epoch(3)
    full = list(sampler)
    it = iter(sampler)
    head = [next(it) for _ in range(5)]
    state = sampler.state_dict()
    assert state["epoch"] == 3 and state["step"] == 5
    resumed = DistributedBinPackSampler(SIZES, 3072, 4, 2, seed=1)
    resumed.load_state_dict(state)
    resumed.set_epoch(3)  # the training loop calls this again on restart: keeps the step
    assert head + list(resumed) == full
    assert list(resumed) == full  # the next pass over the epoch starts from its beginning
    # a prefetching loader runs ahead: the trainer states how many steps it completed
    explicit = DistributedBinPackSampler(SIZES, 3072, 4, 2, seed=1)
    explicit.load_state_dict(sampler.state_dict(steps_done=2))
    assert list(explicit) == full[2:]


def test_resume_refuses_other_data():
    state = DistributedBinPackSampler(SIZES, 3072, 4, 0, seed=1).state_dict()
    with pytest.raises(ValueError, match="capacity"):
        DistributedBinPackSampler(SIZES, 2048, 4, 0, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="sizes_sha1"):
        DistributedBinPackSampler(SIZES[:-1], 3072, 4, 0, seed=1).load_state_dict(state)


def test_forced_padding_is_weighted_warned_counted_or_dropped():
    sizes = [7, 7, 7, 7, 7]  # capacity forces 5 bins -> 8 on 4 ranks
    seen = []
    for rank in range(4):
        sampler = DistributedBinPackSampler(sizes, 7, 4, rank, shuffle=False)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            batches = list(sampler)
            for epoch in (1, 2):  # every epoch has copies: said once per run
                sampler.set_epoch(epoch)
                assert len(list(sampler)) == 2 and sampler.padding_copies == 3
        messages = [str(w.message) for w in said]
        assert len(messages) == (rank == 0) and all("3 padding copies" in m for m in messages)
        assert sampler.padding_copies == 3 and len(batches) == 2
        sampler.set_epoch(0)
        seen += [(b[0], float(sampler.batch_weights(s)[0])) for s, b in enumerate(batches)]
    assert sorted(g for g, w in seen if w == 1.0) == [0, 1, 2, 3, 4]
    assert len([w for _, w in seen if w == 0.0]) == 3
    dropped = DistributedBinPackSampler(sizes, 7, 4, 0, shuffle=False, drop_last=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(dropped)) == 1 and dropped.padding_copies == 0


def test_weighted_pairs_scale_mace_style_weight():
    items = [Item(i) for i in range(5)]
    dataset = PaddingWeightedDataset(items)
    sampler = DistributedBinPackSampler([7] * 5, 7, 4, 1, shuffle=False, with_weights=True)
    batches = list(sampler)  # rank 1: the padding copies are said by rank 0 only
    got = [dataset[pair] for batch in batches for pair in batch]
    assert [float(x.weight) for x in got] == [1.0, 0.0]
    assert all(float(it.weight) == 1.0 for it in items)  # the wrapped items are untouched
    with pytest.raises(TypeError, match="no `weight` field"):
        PaddingWeightedDataset([1, 2])[(0, 0.0)]


def test_bad_rank_is_refused():
    with pytest.raises(ValueError, match="rank 4 is not in"):
        DistributedBinPackSampler(SIZES, 3072, 4, 4)
    with pytest.raises(ValueError, match="unknown strategy"):
        DistributedBinPackSampler(SIZES, 3072, 4, 0, strategy="best_fit")
