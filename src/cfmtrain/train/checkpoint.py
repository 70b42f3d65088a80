"""Checkpoints (tensors and plain data only, loadable with weights_only=True) and the export of
the final model as a standard mace-torch `.model` file (unfused, EMA weights).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import torch

from cfmtrain.atomic import atomic_path
from cfmtrain.train.config import to_dict

CHECKPOINT = "checkpoint.pt"
FORMAT = 1


def checkpoint_state(run, epoch: int, batches_done: int, partial: dict) -> dict:
    """The resumable state at a step boundary: `batches_done` steps of `epoch` are trained;
    `partial` holds the epoch's accumulated sums and elapsed time so far."""
    return {
        "format": FORMAT,
        "epoch": epoch,
        "batches_done": batches_done,
        "global_step": run.global_step,
        "world_size": run.env.world_size,
        "config": to_dict(run.cfg),
        "stats": dataclasses.asdict(run.stats),
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "ema": run.ema.state_dict() if run.ema is not None else None,
        "sampler": {**run.sampler.state_dict(steps_done=batches_done), "epoch": epoch,
                    "step": batches_done},
        "torch_rng": torch.get_rng_state(),
        "partial": partial,
    }


def save_checkpoint(state: dict, path: Path) -> None:
    """Write atomically (rank 0 only)."""
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: Path) -> dict:
    """Load a checkpoint without unpickling code."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path}: not a cfmtrain checkpoint of format {FORMAT}")
    return state


def restore(run, state: dict) -> None:
    """Put the saved model, optimiser, scheduler, EMA, sampler and step into `run`."""
    if state["world_size"] != run.env.world_size:
        raise ValueError(f"checkpoint was written by {state['world_size']} ranks, this run has "
                         f"{run.env.world_size}: the sampler order would differ")
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    if run.ema is not None and state["ema"] is not None:
        run.ema.load_state_dict(state["ema"])
    run.sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["torch_rng"])
    run.global_step = state["global_step"]


def export_model(run, path: Path) -> None:
    """The trained model with its EMA weights, kernels unfused, on the CPU, saved whole with
    torch.save as mace-torch saves `.model` files (loadable by MACECalculator)."""
    if run.ema is not None:
        with run.ema.average_parameters():
            model = copy.deepcopy(run.model)
    else:
        model = copy.deepcopy(run.model)
    if run.cfg.fused:
        from cfmtrain.kernels import unfuse_model

        model = unfuse_model(model)
    model = model.to("cpu")
    with atomic_path(path) as tmp:
        torch.save(model, tmp)
