"""Checkpoints (tensors and plain data only, loaded with weights_only=True) and the export of
the final model as a standard mace-torch `.model` file (unfused, EMA weights).

A run folder keeps its last two checkpoints, `checkpoint.pt` and the one before it,
`checkpoint.prev.pt`; each is written under a temporary name, synced and renamed, so a stop at
any moment leaves at least one complete checkpoint. With `--resume auto` one that cannot be read
is renamed to `*.corrupt` (with a warning) and the run goes on from the other. A checkpoint not
written for want of space is a DiskFullError naming it; the previous ones stay as they were.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
from pathlib import Path

import torch

from cfmtrain.atomic import atomic_path
from cfmtrain.kernels import unfuse_model
from cfmtrain.train.config import to_dict
from cfmtrain.train.diskfull import torch_save, writing
from cfmtrain.train.resume import check_fits
from cfmtrain.train.selection import Selection

CHECKPOINT = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"
FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: unreadable, truncated, refused or of another format.
    The message names the file."""


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
        "data": run.data,
        "stats": dataclasses.asdict(run.stats),
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "ema": run.ema.state_dict() if run.ema is not None else None,
        "sampler": {**run.sampler.state_dict(steps_done=batches_done), "epoch": epoch,
                    "step": batches_done},
        "torch_rng": torch.get_rng_state(),
        "partial": partial,
        "code_versions": run.code_versions,
        "selection": run.selection.as_dict(),  # best model, early stopping, stage two
        "replay_before": run.replay_before,  # the replay set's errors before training
    }


def save_checkpoint(state: dict, path: Path) -> None:
    """Write `path` atomically (rank 0 only), first renaming the checkpoint it replaces to
    `previous_path(path)`: the last two are kept, older ones are gone. Leftover temporary files
    of killed writers are removed."""
    path = Path(path)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):
        if stale.name != f".{path.name}.tmp-{os.getpid()}":
            stale.unlink(missing_ok=True)
    with writing(path), atomic_path(path) as tmp:
        torch_save(state, tmp, sync=True)  # complete on disk before it replaces anything
        if path.exists():
            os.replace(path, previous_path(path))


def previous_path(path: Path) -> Path:
    """Where the checkpoint before `path` is kept: checkpoint.pt -> checkpoint.prev.pt."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def load_checkpoint(path: Path) -> dict:
    """Load a checkpoint with an explicit weights_only=True, so that no code is unpickled even
    after mace-torch has set TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 for the whole process (torch
    honours an explicit argument). FileNotFoundError if absent; CheckpointError, naming the
    file, if it cannot be read or is not a cfmtrain checkpoint of this format. The state's
    `loaded_from` is the file's path (for messages; not saved again)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises zip, pickle and runtime errors of its own
        raise CheckpointError(f"{path}: cannot load checkpoint: {_reason(err)}") from err
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a cfmtrain checkpoint of format {FORMAT}")
    state["loaded_from"] = str(path)
    return state


def _reason(err: Exception) -> str:
    """Why torch.load failed, in one line (its weights-only messages are pages long)."""
    message = str(err)
    if "unsupported global" in message.lower():
        return ("it holds objects other than tensors and plain data (refused: loading it would "
                "run code from the file)")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    detail = lines[0] if lines else ""
    for i, line in enumerate(lines):  # torch's weights-only errors: the reason after a preamble
        if "WeightsUnpickler error:" in line:
            rest = line.split("WeightsUnpickler error:", 1)[1].strip()
            detail = rest or (lines[i + 1] if i + 1 < len(lines) else "")
            break
    return f"unreadable or truncated ({type(err).__name__}: {detail.split('. ')[0][:200]})"


def load_latest(folder: Path, main: bool = True) -> tuple[Path, dict] | None:
    """The newest loadable checkpoint of a run folder, `checkpoint.pt` else `checkpoint.prev.pt`,
    as (path, state); None if there is none. On the `main` rank (rank 0; the others skip it
    alike, quietly) one that cannot be loaded is reported on stderr and renamed to
    `<name>.corrupt`, so that it no longer stands in the run's way."""
    for path in (Path(folder) / CHECKPOINT, previous_path(Path(folder) / CHECKPOINT)):
        try:
            return path, load_checkpoint(path)
        except FileNotFoundError:  # also: moved aside by rank 0 meanwhile
            continue
        except CheckpointError as err:
            if not main:
                continue
            aside = _free_name(path.with_name(f"{path.name}.corrupt"))
            os.replace(path, aside)
            print(f"warning: {err}; moved to {aside.name}, trying an older checkpoint",
                  file=sys.stderr, flush=True)
    return None


def _free_name(path: Path) -> Path:
    """`path`, or `path.1`, `path.2`, ... : the first that does not exist."""
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def restore(run, state: dict) -> None:
    """Put the saved model, optimiser, scheduler, EMA, sampler and step into `run`; a
    checkpoint of another rank count or one that does not fit the model is refused, naming
    the file (resume.MisfitError)."""
    if state["world_size"] != run.env.world_size:
        raise ValueError(f"{state.get('loaded_from', 'checkpoint')}: written by "
                         f"{state['world_size']} ranks, this run has {run.env.world_size}: the "
                         "sampler order would differ")
    check_fits(run.model, state, run.cfg)
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    if run.ema is not None and state["ema"] is not None:
        run.ema.load_state_dict(state["ema"])
    run.sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["torch_rng"])
    run.global_step = state["global_step"]
    run.selection = Selection.from_dict(state.get("selection"))
    run.replay_before = state.get("replay_before")


def export_model(run, path: Path) -> None:
    """The trained model with its EMA weights, kernels unfused, on the CPU, saved whole with
    torch.save as mace-torch saves `.model` files (loadable by MACECalculator), atomically."""
    if run.ema is not None:
        with run.ema.average_parameters():
            model = copy.deepcopy(run.model)
    else:
        model = copy.deepcopy(run.model)
    if run.cfg.fused:
        model = unfuse_model(model)
    model = model.to("cpu")
    with writing(path), atomic_path(path) as tmp:
        torch_save(model, tmp)
