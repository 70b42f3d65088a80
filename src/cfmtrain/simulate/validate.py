"""Cost models for the measured variants (the calibration's law of the variant's compute path,
plus the data wait of its cells) and their validation on the cells: each cell's epoch time
predicted from its own batches' atoms and edges, with the data wait taken from the variant's
cells at the other rank counts, against the epoch time it measured; and its compute against
the compute CPU time it measured. A cell that waited for cores (its compute wall/CPU above the
cells' threshold, or a repeat it reports flagged for wall/CPU or steal in summary.json): its wall
time is no evidence about the cost law, its CPU time is, and that error is the one its
validation counts. A cell flagged only because the host ran slower (its speed probe or CPU time
on identical work) keeps its wall time: its CPU time is slowed as much.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd

from cfmtrain.ranks.contention import Thresholds, compute_wall_cpu
from cfmtrain.simulate.allreduce import Network
from cfmtrain.simulate.costmodel import CostModel
from cfmtrain.simulate.run_steps import STEP, data_wait_s, local_work_s, timed_steps
from cfmtrain.simulate.sharing import node_step_s
from cfmtrain.train.runs import Run


def variant_models(laws: dict[str, CostModel], runs: list[Run],
                   path_of: Callable[[str], str]) -> dict[str, CostModel]:
    """Each measured variant's model: its compute path's law (`path_of(variant)` keys `laws`)
    with the mean data wait of all its cells."""
    models = {}
    for variant in dict.fromkeys(r.variant for r in runs):
        group = [r for r in runs if r.variant == variant]
        law = _law(laws, path_of, variant)
        models[variant] = dataclasses.replace(
            law, variant=variant, data_wait_s=data_wait_s(group),
            sources=[*law.sources, *(str(r.folder) for r in group)])
    return models


def _law(laws: dict[str, CostModel], path_of: Callable[[str], str], variant: str) -> CostModel:
    path = path_of(variant)
    if path not in laws:
        raise ValueError(f"variant {variant}: no calibration of its compute path {path!r} "
                         f"(calibrated: {sorted(laws)})")
    return laws[path]


GradientBytes = float | Callable[[Run], float]


def predict_run(run: Run, model: CostModel, network: Network,
                gradient_bytes: GradientBytes) -> dict:
    """Predicted and measured seconds per epoch of `run` from its own batches' atoms and edges.

    Measured: the sum over steps of the slowest rank's step_s (all parts), averaged over epochs.
    Predicted: the sum over steps of the data wait + the node's modelled compute (its ranks
    share one node: sharing.node_step_s) + an all-reduce. Both also without the all-reduce,
    which tests the cost model and the node model alone, and the slowest rank's compute alone
    against its compute CPU time + optimiser step (cpu_rel_error). `validation_error` is the
    epoch's error, or for a contended cell the CPU's.
    """
    steps = timed_steps(run).sort_values([STEP.epoch, STEP.step, STEP.rank])
    if STEP.compute_cpu_s not in steps:  # a step log from before CPU times were recorded
        steps = steps.assign(compute_cpu_s=np.nan)
    compute = np.where(steps.graphs > 0, model.compute_s(steps.atoms, steps.edges), 0.0)
    steps = steps.assign(compute=compute,
                         measured_work=steps.data_s.to_numpy() + local_work_s(steps),
                         measured_cpu=steps.compute_cpu_s + steps.optim_s)
    per_step = steps.groupby([STEP.epoch, STEP.step]).agg(
        measured=(STEP.step_s, "max"), measured_work=("measured_work", "max"),
        measured_cpu=("measured_cpu", "max"), predicted_compute=("compute", "max"))
    by_rank = steps.pivot_table(index=[STEP.epoch, STEP.step], columns=STEP.rank,
                                values="compute", fill_value=0.0).loc[per_step.index]
    per_step["predicted_work"] = model.data_wait_s + node_step_s(
        by_rank.to_numpy(), run.ranks, model.shared_slowdown)
    epochs = per_step.groupby(STEP.epoch).agg(["sum", "size"])
    nbytes = gradient_bytes(run) if callable(gradient_bytes) else gradient_bytes
    reduce_s = network.allreduce_s(run.ranks, nbytes) if run.ranks > 1 else 0.0
    measured = epochs[("measured", "sum")].mean()
    measured_work = epochs[("measured_work", "sum")].mean()
    predicted_work = epochs[("predicted_work", "sum")].mean()
    predicted = predicted_work + reduce_s * epochs[("measured", "size")].mean()
    step_err = np.abs(per_step.predicted_work - per_step.measured_work) / per_step.measured_work
    cpu = epochs[("measured_cpu", "sum")].mean()
    ratio = compute_wall_cpu(steps.to_dict("records"), int(steps.epoch.min()))[1]
    contended = run.contended or ratio > Thresholds().max_wall_cpu_ratio
    waited = contended and waited_for_cores(run, ratio)
    epoch_error = (predicted - measured) / measured
    # steps.csv of an older version has no CPU times (0 or NaN here): no CPU-time error then
    cpu_error = ((epochs[("predicted_compute", "sum")].mean() - cpu) / cpu if cpu > 0
                 else float("nan"))
    return {"variant": run.variant, "validated_on": f"{run.dataset}/r{run.ranks}",
            "ranks": run.ranks, "measured_epoch_s": measured, "predicted_epoch_s": predicted,
            "epoch_rel_error": epoch_error,
            "measured_work_epoch_s": measured_work, "predicted_work_epoch_s": predicted_work,
            "work_rel_error": (predicted_work - measured_work) / measured_work,
            "step_mean_abs_rel_error": float(step_err.mean()),
            "measured_cpu_epoch_s": cpu, "cpu_rel_error": cpu_error,
            "compute_wall_cpu": ratio, "contended": contended,
            "validation_error": cpu_error if waited else epoch_error,
            "validated_by": ("CPU time (contended cell)" if waited
                             else "wall time (host slower)" if contended else "wall time"),
            "threads": run.summary.get("provenance", {}).get("threads", np.nan)}


def waited_for_cores(run: Run, wall_cpu_ratio: float) -> bool:
    """Whether a contended cell waited for cores: its steps' compute wall/CPU above the threshold,
    or a repeat it reports with compute wall/CPU or steal above the cell's thresholds; a summary
    without per-repeat measures (older, or a single run) counts as waiting when flagged at all."""
    limits = Thresholds(**run.summary.get("contention_thresholds") or {})
    if wall_cpu_ratio > limits.max_wall_cpu_ratio:
        return True
    repeats = [r for r in run.repeats if r.get("used", True)]
    if not repeats:
        return run.contended

    def above(value, limit: float) -> bool:
        return value is not None and float(value) > limit

    return any(above(r.get("wall_cpu_ratio"), limits.max_wall_cpu_ratio)
               or above(r.get("steal_fraction"), limits.max_steal_fraction) for r in repeats)


def cross_validate(laws: dict[str, CostModel], runs: list[Run], path_of: Callable[[str], str],
                   network: Network, gradient_bytes: GradientBytes) -> pd.DataFrame:
    """One row per cell: predicted by its variant's calibrated law with the data wait of the
    variant's cells at the other rank counts (`data_wait_from`; the cell itself when the variant
    was measured at one rank count only), against its measured epoch time."""
    rows = []
    for run in runs:
        others = [r for r in runs if r.variant == run.variant and r.ranks != run.ranks]
        wait_from = others or [run]
        model = dataclasses.replace(_law(laws, path_of, run.variant), variant=run.variant,
                                    data_wait_s=data_wait_s(wait_from))
        rows.append({**predict_run(run, model, network, gradient_bytes),
                     "data_wait_from": " ".join(f"{r.dataset}/r{r.ranks}" for r in wait_from),
                     "fit_r2": model.r2, "fit_mean_rel_error": model.mean_rel_error})
    return pd.DataFrame(rows)
