"""The training step and epoch: timed data wait, compute, straggler wait and all-reduce per rank,
a global loss from all-reduced counts, NaN checks, EMA; and evaluation with the EMA weights.

The step runs on the run's device: its batch moves there once (train.device), the errors are
summed there, and the host waits for the device only where a time is taken.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cfmtrain.ranks.collectives import all_reduce_sum
from cfmtrain.train.device import device_clock, to_device
from cfmtrain.train.loss import distributed_loss
from cfmtrain.train.metrics import ErrorSums, StepTimes
from cfmtrain.train.sampling import global_step_counts, loss_normalizers
from cfmtrain.train.steps import StepRecord


class NonFiniteLossError(FloatingPointError):
    """A NaN or infinite loss; the message names the step and the graphs of the batch."""


class StopFlag:
    """Set by SIGTERM (Slurm preemption, `--signal`); ranks agree on it after every step."""

    def __init__(self):
        self.requested = False

    def install(self) -> None:
        """Handle SIGTERM by asking the loop to checkpoint and stop at the next step end."""
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "requested", True))

    def agreed(self) -> bool:
        """True on every rank if any rank got SIGTERM (one tiny all-reduce: a collective)."""
        flag = all_reduce_sum(torch.tensor([1.0 if self.requested else 0.0]))
        return bool(flag.item() > 0)


def world_size() -> int:
    """Ranks in the run (1 without torch.distributed)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def check_finite(loss: float, batch, step: int) -> None:
    """NonFiniteLossError naming the step and the batch's graphs if `loss` is NaN or infinite."""
    if not math.isfinite(loss):
        store_id = getattr(batch, "store_id", None)
        graphs_in = store_id.tolist() if store_id is not None else "?"
        raise NonFiniteLossError(f"non-finite loss {loss} at step {step}; batch of "
                                 f"{batch.num_graphs} graphs, store indices {graphs_in}")


def forward_backward(model: torch.nn.Module, batch, graphs: float, atoms: float, cfg,
                     step: int, measure: bool, check: bool = True, weights=None
                     ) -> tuple[torch.Tensor, dict]:
    """Forward, loss over the global counts, local backward (DDP's all-reduce deferred in
    measurement mode); returns the detached loss and the predictions. The backward pass goes to
    the trainable parameters only: the positions (and the strain) are leaves of the forces'
    graph, and their second-order gradient, which `loss.backward()` would also compute, feeds
    nothing. `check`: a non-finite loss raises before the backward (a read of the loss, which
    waits for a CUDA device: the training step checks it after its timing wait instead).
    `weights`: the optimiser settings whose loss weights apply (default cfg.optim; stage two's:
    train.selection)."""
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    sync = model.no_sync() if measure and ddp else contextlib.nullcontext()
    with sync:
        pred = model(batch.to_dict(), training=True, compute_force=True,
                     compute_stress=cfg.optim.stress_weight > 0)
        loss = distributed_loss(batch, pred, graphs, atoms, world_size(), weights or cfg.optim)
        if check:
            check_finite(float(loss.detach()), batch, step)
        loss.backward(inputs=[p for p in model.parameters() if p.requires_grad])
    return loss.detach(), pred


def allreduce_gradients(params: list[torch.nn.Parameter]) -> None:
    """Average gradients over ranks in one flat all-reduce (measurement mode)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat /= world_size()
    for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(reduced)


def train_step(run, batch, graphs: float, atoms: float, step: int, times: StepTimes
               ) -> tuple[float, dict, object]:
    """One optimisation step on this rank's batch (on the host: moved to the run's device once);
    fills `times`; returns (loss, predictions, the batch on the device). The host waits for the
    device twice, where the compute and the step end: their times."""
    cfg, measure = run.cfg, run.cfg.measure_straggler and world_size() > 1
    t0, c0 = time.perf_counter(), time.thread_time()
    batch = to_device(batch, run.device)
    run.optimizer.zero_grad(set_to_none=True)
    loss, pred = forward_backward(run.ddp, batch, graphs, atoms, cfg, step, measure, check=False,
                                  weights=run.loss_weights)
    t1 = device_clock(run.device)
    times.compute_s, times.compute_cpu_s = t1 - t0, time.thread_time() - c0
    value = float(loss)  # after the wait: a copy, not a stall
    check_finite(value, batch, step)
    if measure:
        dist.barrier()  # the straggler cost: waiting for the slowest rank's backward
        t2 = time.perf_counter()
        allreduce_gradients(run.params)
        t3 = time.perf_counter()
        times.wait_s, times.allreduce_s, t1 = t2 - t1, t3 - t2, t3
    if cfg.optim.clip_grad > 0:
        torch.nn.utils.clip_grad_norm_(run.params, max_norm=cfg.optim.clip_grad)
    run.optimizer.step()
    if run.ema is not None:
        run.ema.update()
    times.optim_s = device_clock(run.device) - t1
    return value, pred, batch


def epoch_steps(run, epoch: int, skip: int, plan: int | None = None) -> Iterator[StepRecord]:
    """Steps `skip`.. of `epoch`, one record of this rank's per step as it ends; the batches
    of the sampler's epoch `plan` (default `epoch`: a new shuffle each epoch). Closing the
    generator early (SIGTERM, max_steps) stops the loader's prefetch thread."""
    t_plan = time.perf_counter()
    # keeps a resumed sampler's start step within its epoch
    run.sampler.set_epoch(epoch if plan is None else plan)
    counts = loss_normalizers(global_step_counts(run.sampler, run.train_set.num_atoms),
                              run.cfg.epoch_normalized)
    loader = run.make_loader(run.train_set, run.sampler)  # starts at step `skip` when resumed
    run.timeline.setdefault("epoch_plan_s", []).append(time.perf_counter() - t_plan)
    run.timeline["steps_per_epoch"] = len(run.sampler)
    iterator, step = iter(loader), skip
    try:
        while True:
            times, t0, c0 = StepTimes(), time.perf_counter(), time.thread_time()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            times.data_s = time.perf_counter() - t0
            graphs, atoms = counts[step].tolist()
            sizes = {"graphs": int(batch.num_graphs), "atoms": int(batch.num_nodes),
                     "edges": int(batch.edge_index.shape[1])}  # of the batch on the host
            loss, pred, batch = train_step(run, batch, graphs, atoms, run.global_step, times)
            times.cpu_s = time.thread_time() - c0
            run.train_errors.add(batch, pred, run.cfg.optim.stress_weight > 0)
            run.global_step += 1
            step += 1
            yield StepRecord(
                epoch=epoch, step=run.global_step - 1, rank=run.env.rank, **sizes,
                data_s=times.data_s,
                compute_s=times.compute_s, wait_s=times.wait_s, allreduce_s=times.allreduce_s,
                optim_s=times.optim_s, step_s=times.step_s, loss=loss / world_size(),
                cpu_s=times.cpu_s, compute_cpu_s=times.compute_cpu_s)
    finally:
        if hasattr(iterator, "close"):
            iterator.close()


def evaluate(run, dataset, batch_graphs: int, group_of: np.ndarray | None = None,
             groups: int = 1, model: torch.nn.Module | None = None) -> ErrorSums:
    """Errors of the (EMA) model, or of `model` as it is, on this rank's share of `dataset`,
    summed over ranks; with `group_of` (store index -> group id) one row per group."""
    rank, world = run.env.rank, world_size()
    share = list(range(rank, len(dataset), world))
    batches = [share[i:i + batch_graphs] for i in range(0, len(share), batch_graphs)]
    sums = ErrorSums(groups)
    use_stress = run.cfg.optim.stress_weight > 0
    ema = (run.ema.average_parameters() if run.ema is not None and model is None
           else contextlib.nullcontext())
    model = run.model if model is None else model
    with ema:
        for batch in run.make_loader(dataset, batches):
            rows = None
            if group_of is not None:  # from the batch on the host, before its transfer
                rows = torch.as_tensor(group_of[batch.store_id.numpy()], dtype=torch.long)
            batch = to_device(batch, run.device)
            pred = model(batch.to_dict(), training=False, compute_force=True,
                         compute_stress=use_stress)
            sums.add(batch, {k: v.detach() for k, v in pred.items() if v is not None},
                     use_stress, rows)
    return sums.reduced()
