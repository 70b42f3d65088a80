"""What a resume checks beyond the checkpoint's own state: that the checkpoint fits the model
this run built (refused by name otherwise, instead of torch's page of size mismatches).
"""

from __future__ import annotations

import torch

from cfmtrain.train.config import to_dict


class MisfitError(ValueError):
    """A checkpoint whose tensors do not fit this run's model; the message names the file, the
    differing settings and tensors."""


def _shape(t: torch.Tensor) -> str:
    return f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def check_fits(model: torch.nn.Module, state: dict, cfg, shown: int = 3) -> None:
    """MisfitError unless the checkpoint `state`'s model tensors have this `model`'s names,
    shapes and dtypes (load_state_dict would fail on a shape, and cast a dtype silently); the
    message names the checkpoint file, the model.* settings that differ from the run's `cfg`
    and the first `shown` differing tensors."""
    saved, mine = state["model"], model.state_dict()
    differ = []
    for name in sorted(set(saved) | set(mine)):
        a, b = saved.get(name), mine.get(name)
        if a is None or b is None:
            differ.append(f"{name}: {'absent' if a is None else _shape(a)} in the checkpoint, "
                          f"{'absent' if b is None else _shape(b)} in this run")
        elif a.shape != b.shape or a.dtype != b.dtype:
            differ.append(f"{name}: {_shape(a)} in the checkpoint, {_shape(b)} in this run")
    if not differ:
        return
    then, now = state["config"].get("model", {}), to_dict(cfg)["model"]
    keys = [k for k in now if then.get(k) != now[k]]
    if keys:
        settings = (f"it was trained with {', '.join(f'model.{k}={then.get(k)!r}' for k in keys)}"
                    f"; this run has {', '.join(f'model.{k}={now[k]!r}' for k in keys)}")
        todo = "resume with the checkpoint's model settings, or start afresh without --resume"
    else:
        settings = ("its model.* settings are this run's: the model code differs (another "
                    "mace-torch or cfmtrain builds other tensors)")
        todo = "resume with the code that wrote it, or start afresh without --resume"
    more = f" and {len(differ) - shown} more" if len(differ) > shown else ""
    raise MisfitError(f"{state.get('loaded_from', 'checkpoint')}: the checkpoint does not fit "
                      f"this run's model: {settings} ({len(differ)} tensors differ: "
                      f"{'; '.join(differ[:shown])}{more}); {todo}")

