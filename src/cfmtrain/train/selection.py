"""Which model a run keeps and when it stops, as mace-torch's training decides them: the lowest
validation loss so far (`keep_best`: best.model), early stopping after `patience` validations
without a lower one, and Stage Two (`stage_two`): from its start epoch on, its loss weights and
learning rate, the plateau schedule stopped, the best loss and the patience counted afresh.

The state is plain data saved in every checkpoint, so that a resumed run decides exactly as the
uninterrupted one; every rank holds it and decides alike (from the same all-reduced losses).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from cfmtrain.train.config import OptimConfig, TrainConfig


@dataclasses.dataclass
class Selection:
    """Where a run stands in its choice of model (saved in checkpoints)."""

    best_loss: float = math.inf  # the lowest validation loss of the current stage
    best_epoch: int | None = None  # the epoch that reached it (best.model's weights)
    bad: int = 0  # validations since the last lower loss
    stage_two_from: int | None = None  # the epoch stage two began at (None: not yet)
    stage_two_early: int | None = None  # its start, brought forward by patience in stage one
    stopped_at: int | None = None  # the last epoch trained, when stopped early

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> Selection:
        """The state saved in a checkpoint (a checkpoint that kept none: a fresh one)."""
        return cls(**(data or {}))


def planned_start(cfg: TrainConfig) -> int | None:
    """The epoch stage two is configured to begin at: stage_two.start_epoch, else mace-torch's
    max(1, epochs // 4 * 3); None when it is off or would begin after the last epoch."""
    two = cfg.stage_two
    if not two.enabled:
        return None
    start = two.start_epoch if two.start_epoch is not None else max(1, cfg.epochs // 4 * 3)
    return start if start < cfg.epochs else None


def stage_two_start(cfg: TrainConfig, sel: Selection) -> int | None:
    """The epoch stage two begins (or began) at in this run; None if it never does."""
    if sel.stage_two_from is not None:
        return sel.stage_two_from
    if sel.stage_two_early is not None:
        return sel.stage_two_early
    return planned_start(cfg)


def in_stage_two(cfg: TrainConfig, sel: Selection, epoch: int) -> bool:
    start = stage_two_start(cfg, sel)
    return start is not None and epoch >= start


def loss_weights(cfg: TrainConfig, sel: Selection, epoch: int) -> OptimConfig:
    """The optimiser settings whose loss weights epoch `epoch` trains and validates with: the
    run's, or in stage two the stage's (its stress weight only where the run trains on
    stress)."""
    if not in_stage_two(cfg, sel, epoch):
        return cfg.optim
    two = cfg.stage_two
    return dataclasses.replace(cfg.optim, energy_weight=two.energy_weight,
                               forces_weight=two.forces_weight,
                               stress_weight=two.stress_weight if cfg.optim.stress_weight > 0
                               else 0.0)


def begin_epoch(cfg: TrainConfig, sel: Selection, epoch: int,
                optimizer: torch.optim.Optimizer) -> str | None:
    """Before epoch `epoch` trains: in stage two, the stage's learning rate on every parameter
    group; at its first epoch also the best loss and patience counted afresh (mace-torch's
    stage-two losses are not comparable with the first stage's). Returns what to say the first
    time, else None."""
    if not in_stage_two(cfg, sel, epoch):
        return None
    for group in optimizer.param_groups:
        group["lr"] = cfg.stage_two.lr
    if sel.stage_two_from is not None:
        return None
    sel.stage_two_from, sel.best_loss, sel.bad = epoch, math.inf, 0
    w = loss_weights(cfg, sel, epoch)
    return (f"stage two from epoch {epoch}: energy weight {w.energy_weight:g}, forces weight "
            f"{w.forces_weight:g}, stress weight {w.stress_weight:g}, lr {cfg.stage_two.lr:g}")


def after_validation(cfg: TrainConfig, sel: Selection, epoch: int, loss: float
                     ) -> tuple[bool, str | None]:
    """Record epoch `epoch`'s validation loss: (True if it is the stage's lowest so far, what
    to say when patience runs out). Patience run out in the first stage, with stage two
    enabled, brings stage two forward to the next epoch (mace-torch's); otherwise the run stops
    after this epoch (`stopped_at`)."""
    if not math.isfinite(loss):  # no validation graphs: nothing to choose by
        return False, None
    improved = loss < sel.best_loss
    if improved:
        sel.best_loss, sel.best_epoch, sel.bad = loss, epoch, 0
    else:
        sel.bad += 1
    if not cfg.patience or sel.bad < cfg.patience:
        return improved, None
    why = f"no lower validation loss in {sel.bad} validations (patience {cfg.patience})"
    start = stage_two_start(cfg, sel)
    if cfg.stage_two.enabled and sel.stage_two_from is None and epoch + 1 < cfg.epochs \
            and (start is None or start > epoch + 1):
        sel.stage_two_early = epoch + 1
        return improved, f"{why}: stage two starts at epoch {epoch + 1}"
    sel.stopped_at = epoch
    return improved, f"{why}: stopping after epoch {epoch}"


def trained(cfg: TrainConfig, epoch: int, sel: Selection) -> bool:
    """True if a run at epoch `epoch` (the next to train) has nothing left to train."""
    return epoch >= cfg.epochs or sel.stopped_at is not None
