"""The simulator judged on what paired rounds measure: in every group (a data set at a rank count,
`cfmtrain rounds`), each variant's speed-up over the baseline predicted from the group's own
batches, against the group's paired median and its 10-90% range; and one group held out.

A variant's predicted epoch is its own steps' sum of the data wait and the node's compute (its
compute path's calibrated law, scaled to the runs and sharing the node: sharing.py) plus an
all-reduce (validate.predict_run). The data wait, the scale and the node's slowdown come from
the runs of the groups the prediction may use: in sample, all groups; held out, every group but
the one predicted, so that nothing measured in it enters its prediction. The simulator's numbers are
supported when every in-sample ratio lies in its paired range widened by `widen`, and the
held-out group's ratios are within `max_held_out_error` of its paired medians: absolute epoch
times of a shared host drift within minutes, ratios measured in paired rounds do not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from cfmtrain.measure.group_tables import PairedRecord, read_paired
from cfmtrain.paper import BASELINE
from cfmtrain.simulate.allreduce import Network
from cfmtrain.simulate.costmodel import CostModel
from cfmtrain.simulate.run_steps import data_wait_s
from cfmtrain.simulate.sharing import fit_sharing
from cfmtrain.simulate.validate import GradientBytes, predict_run
from cfmtrain.tables import Record, frame
from cfmtrain.train.runs import Run, load_run


@dataclasses.dataclass(frozen=True)
class RatioCheck(Record):
    """ratios.csv: one variant's speed-up over the reference in one group, predicted and
    measured (the paired median and its 10-90% range over `rounds`), the prediction's relative
    error against the median, whether it lies in the range widened by WIDEN, whether the
    group was held out of the prediction, and the groups its data wait came from."""

    dataset: str
    ranks: int
    variant: str
    reference: str
    predicted: float
    measured: float
    measured_p10: float
    measured_p90: float
    rounds: int
    rel_error: float
    inside: bool
    held_out: bool
    data_wait_from: str

    TABLE = "ratios.csv"
    WRITER = "`cfmtrain simulate`"


@dataclasses.dataclass
class Group:
    """A group's folder: its paired.csv rows and its variants' runs."""

    folder: Path
    paired: pd.DataFrame
    runs: dict[str, Run]

    @property
    def name(self) -> str:
        return f"{self.paired.dataset.iloc[0]}/r{int(self.paired.ranks.iloc[0])}"


def load_group(folder: str | Path) -> Group:
    """A group from its folder (results/train/<set>/r<ranks>): paired.csv and one run folder per
    variant; a missing file is an error naming it."""
    folder = Path(folder)
    paired = read_paired([folder / PairedRecord.TABLE])
    if paired.empty:
        raise ValueError(f"{folder / PairedRecord.TABLE}: no rows")
    variants = sorted(set(paired.variant) | set(paired.reference))
    return Group(folder, paired, {v: load_run(folder / v) for v in variants})


def group_name(run: Run) -> str:
    return f"{run.dataset}/r{run.ranks}"


def ratio_checks(laws: dict[str, CostModel], groups: list[Group],
                 path_of: Callable[[str], str], network: Network,
                 gradient_bytes: GradientBytes, held_out: str | None,
                 widen: float) -> pd.DataFrame:
    """RatioCheck rows: every group's variants against the baseline, predicted in sample; the
    group named `held_out` (data set/r<ranks>) predicted with the data wait of the others."""
    rows = []
    for group in groups:
        out = group.name == held_out
        others = [g for g in groups if g is not group] if out else groups
        if out and not others:
            raise ValueError(f"held-out group {held_out}: no other group to predict it from")
        predicted, sources = {}, {}
        for variant, run in group.runs.items():
            runs = [g.runs[variant] for g in others if variant in g.runs]
            if not runs:
                raise ValueError(f"{group.folder}: variant {variant} measured in no other group")
            path = path_of(variant)
            law = laws[path]
            same_path = [r for g in others for v, r in g.runs.items() if path_of(v) == path]
            model = dataclasses.replace(law, variant=variant, data_wait_s=data_wait_s(runs),
                                        **fit_sharing(law, same_path))
            predicted[variant] = predict_run(run, model, network, gradient_bytes)[
                "predicted_epoch_s"]
            sources[variant] = " ".join(group_name(r) for r in runs)
        measured = group.paired[group.paired.reference == BASELINE.name]
        for row in measured.itertuples():
            if row.variant == BASELINE.name:
                continue
            ratio = predicted[BASELINE.name] / predicted[row.variant]
            low, high = row.ratio_p10 / (1 + widen), row.ratio_p90 * (1 + widen)
            rows.append(RatioCheck(
                dataset=row.dataset, ranks=int(row.ranks), variant=row.variant,
                reference=BASELINE.name, predicted=float(ratio), measured=row.ratio_median,
                measured_p10=row.ratio_p10, measured_p90=row.ratio_p90, rounds=int(row.rounds),
                rel_error=float(ratio / row.ratio_median - 1),
                inside=bool(low <= ratio <= high), held_out=out,
                data_wait_from=sources[row.variant]))
    return frame(rows, RatioCheck)


def ratio_verdict(checks: pd.DataFrame, held_out: str | None,
                  max_held_out_error: float) -> dict:
    """Whether the ratio checks support the simulator's numbers, and why not: every in-sample
    ratio inside its widened range, the held-out group's within `max_held_out_error`. Also the
    held-out group's worst error and the worst error over all checks (the model error that
    widens the simulated bands)."""
    reasons = []
    inner = checks[~checks.held_out.astype(bool)]
    outer = checks[checks.held_out.astype(bool)]
    for row in inner[~inner.inside.astype(bool)].itertuples():
        reasons.append(f"{row.dataset}/r{row.ranks} {row.variant}: predicted {row.predicted:.2f}x "
                       f"outside the paired range {row.measured_p10:.2f}-{row.measured_p90:.2f}x")
    held_error = float(outer.rel_error.abs().max()) if len(outer) else float("nan")
    if held_out is None:
        reasons.append("no group held out")
    elif outer.empty:
        reasons.append(f"held-out group {held_out} not measured")
    elif not held_error <= max_held_out_error:
        worst = outer.loc[outer.rel_error.abs().idxmax()]
        reasons.append(f"held-out {held_out} {worst.variant}: predicted {worst.predicted:.2f}x "
                       f"against {worst.measured:.2f}x ({100 * held_error:.1f}% > "
                       f"{100 * max_held_out_error:g}%)")
    worst = float(checks.rel_error.abs().max()) if len(checks) else 0.0
    return {"supported": not reasons, "unsupported_reason": "; ".join(reasons),
            "held_out": held_out or "", "held_out_error": held_error,
            "worst_ratio_error": worst if np.isfinite(worst) else 0.0}
