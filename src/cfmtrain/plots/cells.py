"""The measured training runs behind Figures 6-10 as tidy tables: each run's median epoch time
with its min and max (over a group's paired rounds, or a cell's repeats) and its contention
flag, and the speed-ups and scaling efficiencies computed from them. A speed-up over the
baseline is the median of per-round ratios of the group's paired rounds (paired.csv of
`cfmtrain rounds`), with its 10-90% range; for runs given without their group's paired.csv it
is the ratio of the medians (rounds 0, the range from the repeats' min and max). A summary of
a single run without repeats counts as one repeat: min = max = its epoch time, not contended.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from cfmtrain.measure.group_tables import PairedRecord, read_paired
from cfmtrain.paper import BASELINE
from cfmtrain.plots.common import ordered
from cfmtrain.plots.ratios import baseline_over, strong_efficiency, weak_efficiency
from cfmtrain.tables import frame
from cfmtrain.train.runs import RunSummary, load_runs
from cfmtrain.train.steps import StepRecord

CELL, PAIRED, STEP = RunSummary.col, PairedRecord.col, StepRecord.col
CELL_COLUMNS = tuple(c for c in RunSummary.columns() if c != CELL.repeats)
EPOCH_TIMES = (CELL.epoch_time_s, CELL.epoch_time_min_s, CELL.epoch_time_max_s)  # median, min, max
PAIRED_COLUMNS = ("speedup_p10", "speedup_p90", PAIRED.rounds)
SPEEDUP_COLUMNS = (*CELL_COLUMNS[:-1], "speedup", *PAIRED_COLUMNS, CELL.contended)  # Figs 6, 8
GROUP = [PAIRED.dataset, PAIRED.ranks, PAIRED.variant]  # a group's variant
RATIOS = [PAIRED.ratio_median, PAIRED.ratio_p10, PAIRED.ratio_p90]


def cells_table(paths: list[str | Path]) -> pd.DataFrame:
    """One row per cell (run folders or their summary.json), in the given order: its median
    epoch time, min and max over repeats, contention and repeats; the same (data set, variant,
    ranks) twice is an error."""
    table = frame([run.record() for run in load_runs(paths)], RunSummary)
    cell = [CELL.dataset, CELL.variant, CELL.ranks]
    twice = table.duplicated(cell, keep=False)
    if twice.any():
        cells = table.loc[twice, cell].drop_duplicates()
        raise ValueError(f"the same cell given twice: {cells.to_dict('records')}")
    return table


def read_inputs(paths: list[str | Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the runs' cells_table, the groups' paired ratios) of a figure's inputs: run folders or
    summary.json, and paired.csv files."""
    pairs = [p for p in paths if Path(p).name == PairedRecord.TABLE]
    runs = [p for p in paths if Path(p).name != PairedRecord.TABLE]
    return cells_table(runs), read_paired(pairs)


def with_paired(table: pd.DataFrame, paired: pd.DataFrame) -> pd.DataFrame:
    """`table` (with a ratio-of-medians `speedup`) given each variant's paired speed-up over
    the baseline where its group has one: speedup, speedup_p10, speedup_p90 and rounds."""
    over = paired[paired.reference == BASELINE.name][[*GROUP, *RATIOS, PAIRED.rounds]]
    over = over.astype({PAIRED.ranks: int, **dict.fromkeys(RATIOS, float), PAIRED.rounds: float})
    merged = table.merge(over, on=GROUP, how="left")
    merged["speedup"] = merged.ratio_median.where(merged.ratio_median.notna(), merged.speedup)
    merged["speedup_p10"] = merged.ratio_p10
    merged["speedup_p90"] = merged.ratio_p90
    merged[PAIRED.rounds] = merged[PAIRED.rounds].fillna(0).astype(int)
    return merged.drop(columns=RATIOS)


def _in_order(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows grouped by `keys` in first-seen order (none: one group), then by variant in the
    canonical order, then by ranks."""
    group = frame.groupby(keys, sort=False).ngroup() if keys else 0
    rank = {v: k for k, v in enumerate(ordered(frame.variant))}
    return (frame.assign(_g=group, _v=frame.variant.map(rank))
            .sort_values(["_g", "_v", CELL.ranks], kind="stable").drop(columns=["_g", "_v"])
            .reset_index(drop=True))


def speedup_table(cells: pd.DataFrame, paired: pd.DataFrame | None = None,
                  figure: str = "speed-up") -> pd.DataFrame:
    """Figures 6 and 8: each variant's speed-up over the baseline per data set and rank count
    (groups in input order): the paired median where `paired` has the group, else the ratio
    of the median epoch times."""
    table = _in_order(cells, [CELL.dataset, CELL.ranks])
    table["speedup"] = baseline_over(table, CELL.epoch_time_s, CELL.epoch_time_s, figure=figure)
    table = with_paired(table, read_paired([]) if paired is None else paired)
    return table[list(SPEEDUP_COLUMNS)]


def speedup_range(table: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """The error bar of each speed-up: the paired rounds' 10-90% range, or for a speed-up
    without rounds the baseline's median over the variant's slowest and fastest repeat."""
    rounds = PAIRED.rounds
    paired = table[rounds] > 0 if rounds in table else pd.Series(False, table.index)
    low = baseline_over(table, CELL.epoch_time_s, CELL.epoch_time_max_s)
    high = baseline_over(table, CELL.epoch_time_s, CELL.epoch_time_min_s)
    if paired.any():
        low = low.where(~paired, table.speedup_p10)
        high = high.where(~paired, table.speedup_p90)
    return low, high


def _paired_speedups(table: pd.DataFrame, paired: pd.DataFrame | None) -> pd.DataFrame:
    """`table` with each row's paired speed-up over its group's baseline and its range, where
    `paired` has the group (NaN and rounds 0 elsewhere: scaling needs no baseline)."""
    return with_paired(table.assign(speedup=math.nan),
                       read_paired([]) if paired is None else paired)


def strong_scaling_table(cells: pd.DataFrame, paired: pd.DataFrame | None = None
                         ) -> pd.DataFrame:
    """Figure 7: epoch times by rank count with the strong scaling efficiency, per data set and
    variant (the reference: its fewest ranks), and the paired speed-up at each count."""
    table = _in_order(cells, [CELL.dataset])
    table["strong_efficiency"] = strong_efficiency(table, CELL.epoch_time_s)
    table = _paired_speedups(table, paired)
    return table[[*CELL_COLUMNS, "strong_efficiency", "speedup", *PAIRED_COLUMNS]]


def weak_scaling_table(cells: pd.DataFrame, paired: pd.DataFrame | None = None
                       ) -> pd.DataFrame:
    """Figure 10: epoch times as data set and ranks grow together, with the weak scaling
    efficiency per variant (the reference: its fewest ranks), and the paired speed-up."""
    table = _in_order(cells, [])
    table["weak_efficiency"] = weak_efficiency(table, CELL.epoch_time_s)
    table = _paired_speedups(table, paired)
    return table[[*CELL_COLUMNS, "weak_efficiency", "speedup", *PAIRED_COLUMNS]]


def loss_table(paths: list[str | Path]) -> pd.DataFrame:
    """Figure 9: training (and validation, where logged) loss per epoch of each run."""
    frames = []
    for run in load_runs(paths):
        epochs = run.epochs()
        frames.append(pd.DataFrame({
            "dataset": run.dataset, "variant": run.variant, "ranks": run.ranks,
            "epoch": epochs.epoch, "train_loss": epochs.train_loss,
            "valid_loss": epochs.valid_loss}))
    return pd.concat(frames, ignore_index=True)


STEP_PARTS = (STEP.compute_s, STEP.optim_s, STEP.wait_s, STEP.allreduce_s, STEP.data_s)


def straggler_table(paths: list[str | Path], skip_first_epoch: bool = True) -> pd.DataFrame:
    """Figure 13: per run and rank, the mean seconds per step of each part (steps.csv, the
    first epoch left out as warm-up when there are several), and the run's compute share."""
    frames = []
    for run in load_runs(paths):
        steps = run.steps()
        if skip_first_epoch and steps.epoch.nunique() > 1:
            steps = steps[steps.epoch != steps.epoch.min()]
        means = steps.groupby(STEP.rank)[list(STEP_PARTS)].mean().fillna(0.0).reset_index()
        total = means[list(STEP_PARTS)].to_numpy().sum()
        share = means.compute_s.sum() / total if total else math.nan
        frames.append(means.assign(dataset=run.dataset, variant=run.variant, ranks=run.ranks,
                                   compute_share=share))
    columns = [CELL.dataset, CELL.variant, CELL.ranks, STEP.rank, *STEP_PARTS, "compute_share"]
    return pd.concat(frames, ignore_index=True)[columns]
