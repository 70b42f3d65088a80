"""Cost models from measured runs, and their validation on runs they were not fitted on
(fit on 1 rank, predict 2, and the reverse): predicted against measured epoch time.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from cfmtrain.simulate.allreduce import Network
from cfmtrain.simulate.costmodel import CostModel, fit_cost_model, local_work_s
from cfmtrain.simulate.runs import Run


def timed_steps(run: Run, skip_steps: int = 1) -> pd.DataFrame:
    """The run's step log without its first `skip_steps` steps (warm-up: allocation, caches)."""
    steps = run.steps()
    return steps[steps.step >= steps.step.min() + skip_steps]


def fit_variants(runs: list[Run], skip_steps: int = 1) -> dict[str, CostModel]:
    """One cost model per variant from all of that variant's runs pooled."""
    by_variant: dict[str, list[Run]] = {}
    for run in runs:
        by_variant.setdefault(run.variant, []).append(run)
    return {variant: fit_cost_model(pd.concat([timed_steps(r, skip_steps) for r in group]),
                                    variant, [str(r.folder) for r in group])
            for variant, group in by_variant.items()}


GradientBytes = float | Callable[[Run], float]


def predict_run(run: Run, model: CostModel, network: Network, gradient_bytes: GradientBytes,
                skip_steps: int = 1) -> dict:
    """Predicted and measured seconds per epoch of `run` from its own batches' atoms and edges.

    Measured: the sum over steps of the slowest rank's step_s (all parts), averaged over epochs.
    Predicted: the sum over steps of max over ranks (data wait + modelled work) + an all-reduce.
    Both also without the all-reduce, which tests the cost model and the max over ranks alone.
    """
    steps = timed_steps(run, skip_steps)
    steps = steps.assign(work=model.step_s(steps.atoms, steps.edges),
                         measured_work=steps.data_s.to_numpy() + local_work_s(steps))
    per_step = steps.groupby(["epoch", "step"]).agg(
        measured=("step_s", "max"), measured_work=("measured_work", "max"),
        predicted_work=("work", "max"))
    epochs = per_step.groupby("epoch").agg(["sum", "size"])
    nbytes = gradient_bytes(run) if callable(gradient_bytes) else gradient_bytes
    reduce_s = network.allreduce_s(run.ranks, nbytes) if run.ranks > 1 else 0.0
    measured = epochs[("measured", "sum")].mean()
    predicted_work = epochs[("predicted_work", "sum")].mean()
    predicted = predicted_work + reduce_s * epochs[("measured", "size")].mean()
    step_err = np.abs(per_step.predicted_work - per_step.measured_work) / per_step.measured_work
    return {"variant": run.variant, "validated_on": f"{run.dataset}/r{run.ranks}",
            "ranks": run.ranks, "measured_epoch_s": measured, "predicted_epoch_s": predicted,
            "epoch_rel_error": (predicted - measured) / measured,
            "measured_work_epoch_s": epochs[("measured_work", "sum")].mean(),
            "predicted_work_epoch_s": predicted_work,
            "work_rel_error": (predicted_work - epochs[("measured_work", "sum")].mean())
            / epochs[("measured_work", "sum")].mean(),
            "step_mean_abs_rel_error": float(step_err.mean()),
            "threads": run.summary.get("provenance", {}).get("threads", np.nan)}


def cross_validate(runs: list[Run], network: Network, gradient_bytes: GradientBytes,
                   skip_steps: int = 1) -> pd.DataFrame:
    """For each variant and each pair of its runs at different rank counts: fit on one, predict
    the other. Empty when no variant has runs at two rank counts."""
    rows = []
    for fit_run in runs:
        others = [r for r in runs if r.variant == fit_run.variant and r.ranks != fit_run.ranks]
        if not others:
            continue
        model = fit_cost_model(timed_steps(fit_run, skip_steps), fit_run.variant,
                               [str(fit_run.folder)])
        for other in others:
            row = predict_run(other, model, network, gradient_bytes, skip_steps)
            rows.append({"fit_on": f"{fit_run.dataset}/r{fit_run.ranks}", **row,
                         "fit_r2": model.r2, "fit_mean_rel_error": model.mean_rel_error})
    return pd.DataFrame(rows)
