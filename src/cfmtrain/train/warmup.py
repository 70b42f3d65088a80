"""The memory warm-up before a run's epochs: one forward and backward pass, without an optimiser
step, on the largest batches this rank will train.

A process pays for its memory high-water mark once: the first step on a batch larger than any
before it grows the heap and touches fresh pages (1.5 s more than the same step later, on a
1,536-atom batch of mace-torch's path on this project's machine). With shuffled batches that
first step falls in a timed epoch, by chance. Repeats in the same process reuse the memory, so
only batches above the process's peak so far are run here. The model, optimiser and EMA are left
as they were: the gradients are cleared, and the training that follows is the same.
"""

from __future__ import annotations

import copy
import sys
import time
import warnings

import numpy as np

from cfmtrain.train.loop import forward_backward

_peak = {"atoms": 0, "edges": 0}  # the largest batch this process has warmed up on


def largest_batches(sampler, num_atoms: np.ndarray, num_edges: np.ndarray,
                    epochs: range) -> list[np.ndarray]:
    """This rank's batches (positions in the training set) with the most edges and with the
    most atoms over `epochs`, from the seeded plans (one batch if they are the same)."""
    probe = copy.copy(sampler)  # set_epoch must not move the run's own sampler
    rank, ranks = sampler.rank, sampler.num_replicas
    best: dict[str, tuple[int, np.ndarray | None]] = {"edges": (-1, None), "atoms": (-1, None)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # padding copies: the run's own sampler says so
        for epoch in epochs:
            probe.set_epoch(epoch)
            plan = probe.plan
            for key, sizes in (("edges", num_edges), ("atoms", num_atoms)):
                loads = plan.loads(sizes)[rank::ranks]
                k = int(np.argmax(loads)) if len(loads) else -1
                if k >= 0 and loads[k] > best[key][0]:
                    best[key] = (int(loads[k]), plan.bin(k * ranks + rank))
    batches = [b for _, b in best.values() if b is not None and len(b)]
    if len(batches) == 2 and np.array_equal(batches[0], batches[1]):
        batches = batches[:1]
    return batches


def warm_up(run, epochs: range) -> float:
    """Run forward and backward on this rank's largest batches of `epochs` that exceed the
    process's peak so far; returns the seconds spent (0 if none did)."""
    t0 = time.perf_counter()
    data = run.train_set
    batches = [b for b in largest_batches(run.sampler, data.num_atoms, data.num_edges, epochs)
               if data.num_atoms[b].sum() > _peak["atoms"]
               or data.num_edges[b].sum() > _peak["edges"]]
    if not batches:
        return 0.0
    cfg = run.cfg
    for batch in run.make_loader(data, [b.tolist() for b in batches]):
        batch = batch.to(run.device)
        # the bare model, not DDP: no collective, so each rank warms up on its own batches
        forward_backward(run.model, batch, float(batch.num_graphs), float(batch.num_nodes),
                         cfg, -1, measure=False)
        run.optimizer.zero_grad(set_to_none=True)
        _peak["atoms"] = max(_peak["atoms"], int(batch.num_nodes))
        _peak["edges"] = max(_peak["edges"], int(batch.edge_index.shape[1]))
    seconds = time.perf_counter() - t0
    if run.env.rank == 0:
        print(f"memory warm-up on {len(batches)} largest batch(es) (up to {_peak['atoms']} "
              f"atoms, {_peak['edges']} edges): {seconds:.1f} s", file=sys.stderr, flush=True)
    return seconds
