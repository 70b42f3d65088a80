"""The training step's side of the device: one transfer of each batch, and the clock that waits
for the device where a time is taken.

A batch comes from the loader on the host (page-locked when the device is CUDA:
batches.prefetch) and moves in one `to(device, non_blocking=True)` per step. On CUDA the host
only queues work, so a time read without waiting would time the queueing: `device_clock` waits
for the device first. Those waits, one where the compute ends and one where the step ends, are
the step's only syncs; the loss is read after the first, when it costs a copy, not a stall.
"""

from __future__ import annotations

import time

import torch


def to_device(batch, device: torch.device):
    """The batch on `device`: every tensor field moved once, asynchronously from pinned memory
    (on the host already: the same tensors)."""
    return batch.to(device, non_blocking=True)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on a CUDA `device` (nothing to wait for elsewhere)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_clock(device: torch.device) -> float:
    """time.perf_counter() once `device` has finished the work queued so far."""
    synchronize(device)
    return time.perf_counter()
