"""The memory warm-up before a run's epochs: its choice of batches against a scan of the sampler's
own iteration, and a warm-up that leaves the run as it was and runs once per process peak."""

import numpy as np
import pytest
import torch
from helpers import TINY

from cfmtrain.balance import DistributedBinPackSampler
from cfmtrain.ranks.distenv import DistEnv
from cfmtrain.train import warmup
from cfmtrain.train.build import build_run
from cfmtrain.train.config import load_config


def scan(sampler, sizes: np.ndarray, epochs: range) -> np.ndarray:
    """The first batch with the largest load of `sizes`, as the sampler yields them."""
    best, batch = -1, None
    for epoch in epochs:
        sampler.set_epoch(epoch)
        for indices in sampler:
            load = sizes[indices].sum()
            if load > best:
                best, batch = load, np.array(indices)
    return batch


@pytest.mark.filterwarnings("ignore:DistributedBinPackSampler")  # padding copies
@pytest.mark.parametrize("strategy", ["algorithm1", "fixed_count"])
@pytest.mark.parametrize("rank", [0, 2])
def test_largest_batches_are_the_samplers_largest(strategy, rank):
    rng = np.random.default_rng(7)
    atoms = rng.integers(1, 200, 101)
    edges = atoms * rng.integers(5, 60, 101)  # not in proportion: two different batches
    options = {"graphs_per_batch": 3} if strategy == "fixed_count" else {"oversize": "own_bin"}
    sampler = DistributedBinPackSampler(edges, 2000, 3, rank, seed=1, strategy=strategy,
                                        **options)
    sampler.set_epoch(1)
    found = warmup.largest_batches(sampler, atoms, edges, range(1, 4))
    assert sampler.epoch == 1  # the run's sampler is not moved
    by_edges, by_atoms = scan(sampler, edges, range(1, 4)), scan(sampler, atoms, range(1, 4))
    expected = [by_edges] if np.array_equal(by_edges, by_atoms) else [by_edges, by_atoms]
    assert len(found) == len(expected)
    for got, want in zip(found, expected, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_warm_up_runs_once_per_peak_and_leaves_the_run_as_it_was(data, tmp_path, monkeypatch):
    monkeypatch.setattr(warmup, "_peak", {"atoms": 0, "edges": 0})  # a fresh process
    cfg = load_config(overrides=[*TINY, "epochs=2"])
    run = build_run(cfg, data[0], data[1], tmp_path, DistEnv(), torch.device("cpu"))
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    sampler_state = run.sampler.state_dict()
    calls = []
    model_forward = run.model.forward
    monkeypatch.setattr(run.model, "forward", lambda *a, **k: calls.append(1) or
                        model_forward(*a, **k))

    assert warmup.warm_up(run, range(2)) > 0
    batches = warmup.largest_batches(run.sampler, run.train_set.num_atoms,
                                     run.train_set.num_edges, range(2))
    assert len(calls) == len(batches) >= 1
    largest = max(int(run.train_set.num_edges[b].sum()) for b in batches)
    assert warmup._peak["edges"] == largest
    for name, value in run.model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert all(p.grad is None for p in run.params)
    assert not run.optimizer.state  # no optimiser step was taken
    assert run.sampler.state_dict() == sampler_state

    assert warmup.warm_up(run, range(2)) == 0.0  # a second run in the process: memory is there
    assert len(calls) == len(batches)
