"""What a resume checks and records beyond the checkpoint's own state: that the run's settings
are the checkpoint's (but `epochs` and the settings of one call, config.PER_CALL), that the
checkpoint fits the model this run built (refused by name otherwise, instead of torch's page of
size mismatches), and which code versions have trained the run (a change is recorded and said).
"""

from __future__ import annotations

import sys

import torch

from cfmtrain.train.config import PER_CALL, to_dict

# Keys that may differ between a checkpoint and the run that resumes it: the call's own
# (config.PER_CALL), and the number of epochs (a run may be extended). Any other would be
# applied mid-run (a learning rate the optimiser's saved state overrides, a scheduler fed
# another's state, a loss weighted anew) or break the resume (another seed's batch order).
RESUMABLE = frozenset({"epochs", *PER_CALL})


def flat(config: dict, prefix: str = "") -> dict:
    """A nested config dict as {dotted key: value}."""
    out = {}
    for k, v in config.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def changed_settings(saved: dict, wanted: dict) -> list[str]:
    """'key: value in the checkpoint, value in this run' for every setting but RESUMABLE's in
    which the run's config dict `wanted` differs from the checkpoint's `saved`, by key."""
    then, now = flat(saved), flat(wanted)
    return [f"{k}: {then[k]!r} in the checkpoint, {now[k]!r} in this run" if k in then
            else f"{k}: absent in the checkpoint, {now[k]!r} in this run"
            for k in sorted(now) if k not in RESUMABLE and then.get(k, ...) != now[k]]


def refuse_changes(path: object, changed: list[str]) -> None:
    """ValueError naming the checkpoint `path` and the `changed` settings (changed_settings),
    for a resume from an explicit checkpoint."""
    if changed:
        raise ValueError(f"{path}: not resumed, this run's settings differ from the "
                         f"checkpoint's ({'; '.join(changed)}); only epochs and the settings of "
                         f"one call ({', '.join(PER_CALL)}) may change on resume: drop the "
                         "changes, or start afresh without --resume")


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


def code_versions(state: dict | None, current: dict, main: bool) -> list[dict]:
    """Which code trained the run, oldest first: each entry is a code_version() (commit,
    package version, sources digest) with the global step, epoch and step of the epoch it took
    over at. A fresh run starts the list; a resumed one continues its checkpoint's, adding
    `current` if the code differs, which the `main` rank says on stderr in one line. A
    checkpoint of a cfmtrain that kept no list counts as code of unknown version."""
    if state is None:
        return [{**current, "global_step": 0, "epoch": 0, "epoch_step": 0}]
    where = {"global_step": state["global_step"], "epoch": state["epoch"],
             "epoch_step": state["batches_done"]}
    unknown = {"commit": "unknown", "version": None, "sources": None,
               "global_step": 0, "epoch": 0, "epoch_step": 0}
    versions = list(state.get("code_versions") or [unknown])
    last = versions[-1]
    if all(last.get(k) == v for k, v in current.items()):
        return versions
    if main:
        print(f"code changed on resume: {state.get('loaded_from', 'the checkpoint')} was trained "
              f"to global step {where['global_step']} (epoch {where['epoch']}, step "
              f"{where['epoch_step']}) by {_label(last)}; the run goes on with "
              f"{_label(current)} (both in code_versions of the checkpoint and summary.json)",
              file=sys.stderr, flush=True)
    return [*versions, {**current, **where}]


def _label(version: dict) -> str:
    """cfmtrain's commit, with the package version and sources digest where they tell more."""
    if version.get("sources") is None:
        return "an unrecorded cfmtrain version (a checkpoint of an older cfmtrain)"
    return (f"cfmtrain {version.get('version')} commit {version['commit']} "
            f"(sources {version['sources']})")
