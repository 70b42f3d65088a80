"""Sums over ranks of host tensors, through the device the process group's backend reduces on.

gloo reduces CPU tensors where they are; NCCL only CUDA ones: a host tensor (statistics, error
sums, the stop flag) goes to the rank's GPU for the all-reduce and comes back to the host.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def collective_device() -> torch.device:
    """The device the process group's backend reduces on: the rank's GPU for NCCL, else the
    CPU (also without a process group)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed over every rank (a collective), on `tensor`'s own device; itself with one
    rank or no process group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return tensor
    device = collective_device()
    if tensor.device == device:
        dist.all_reduce(tensor)
        return tensor
    moved = tensor.to(device)
    dist.all_reduce(moved)
    return moved.to(tensor.device)
