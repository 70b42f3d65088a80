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

from cfmtrain.paper import BASELINE
from cfmtrain.plots.common import ordered
from cfmtrain.plots.ratios import baseline_over, strong_efficiency, weak_efficiency
from cfmtrain.simulate.runs import Run, load_runs

CELL_COLUMNS = ("dataset", "ranks", "variant", "epoch_time_s", "epoch_time_min_s",
                "epoch_time_max_s", "contended")
PAIRED_COLUMNS = ("speedup_p10", "speedup_p90", "rounds")
SPEEDUP_COLUMNS = (*CELL_COLUMNS[:-1], "speedup", *PAIRED_COLUMNS, "contended")  # Figs 6, 8
PAIRED_FILE = "paired.csv"
PAIRED_NEEDS = ("dataset", "ranks", "variant", "reference", "ratio_median", "ratio_p10",
                "ratio_p90", "rounds")


def cell_row(run: Run) -> dict:
    """One cell: its median epoch time, min and max over repeats, repeats and contention."""
    s, where = run.summary, run.folder / "summary.json"
    try:
        median = run.epoch_time_s
        low = float(s.get("epoch_time_min_s", median))
        high = float(s.get("epoch_time_max_s", median))
    except (TypeError, ValueError):
        raise ValueError(f"{where}: epoch times must be numbers, got epoch_time_s "
                         f"{s.get('epoch_time_s')!r}, min {s.get('epoch_time_min_s')!r}, max "
                         f"{s.get('epoch_time_max_s')!r}") from None
    if not all(math.isfinite(v) and v > 0 for v in (median, low, high)):
        raise ValueError(f"{where}: epoch times must be positive numbers, got median {median}, "
                         f"min {low}, max {high}")
    if not low <= median <= high:
        raise ValueError(f"{where}: epoch_time_s {median} is not within its repeats' min "
                         f"{low} and max {high}")
    repeats = s.get("repeats")  # a cell's repeats; a group's run has its rounds' count
    return {"dataset": run.dataset, "ranks": run.ranks, "variant": run.variant,
            "epoch_time_s": median, "epoch_time_min_s": low, "epoch_time_max_s": high,
            "contended": bool(s.get("contended", False)),
            "repeats": len(repeats) if isinstance(repeats, list) else int(s.get("rounds", 1))}


def cells_table(paths: list[str | Path]) -> pd.DataFrame:
    """One row per cell (run folders or their summary.json), in the given order; the same
    (data set, variant, ranks) twice is an error."""
    frame = pd.DataFrame([cell_row(run) for run in load_runs(paths)])
    twice = frame.duplicated(["dataset", "variant", "ranks"], keep=False)
    if twice.any():
        cells = frame.loc[twice, ["dataset", "variant", "ranks"]].drop_duplicates()
        raise ValueError(f"the same cell given twice: {cells.to_dict('records')}")
    return frame


def read_inputs(paths: list[str | Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the runs' cells_table, the groups' paired ratios) of a figure's inputs: run folders or
    summary.json, and paired.csv files."""
    pairs = [p for p in paths if Path(p).name == PAIRED_FILE]
    runs = [p for p in paths if Path(p).name != PAIRED_FILE]
    return cells_table(runs), read_paired(pairs)


def read_paired(paths: list[str | Path]) -> pd.DataFrame:
    """The groups' paired.csv rows, one table; a file lacking a column is named."""
    frames = []
    for path in paths:
        frame = pd.read_csv(path)
        missing = [c for c in PAIRED_NEEDS if c not in frame]
        if missing:
            raise ValueError(f"{path}: not a paired.csv of `cfmtrain rounds` (no {missing})")
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=list(PAIRED_NEEDS))
    return pd.concat(frames, ignore_index=True)


def with_paired(table: pd.DataFrame, paired: pd.DataFrame) -> pd.DataFrame:
    """`table` (with a ratio-of-medians `speedup`) given each variant's paired speed-up over
    the baseline where its group has one: speedup, speedup_p10, speedup_p90 and rounds."""
    over = paired[paired.reference == BASELINE.name][
        ["dataset", "ranks", "variant", "ratio_median", "ratio_p10", "ratio_p90", "rounds"]]
    over = over.astype({"ranks": int, "ratio_median": float, "ratio_p10": float,
                        "ratio_p90": float, "rounds": float})
    merged = table.merge(over, on=["dataset", "ranks", "variant"], how="left")
    merged["speedup"] = merged.ratio_median.where(merged.ratio_median.notna(), merged.speedup)
    merged["speedup_p10"] = merged.ratio_p10
    merged["speedup_p90"] = merged.ratio_p90
    merged["rounds"] = merged["rounds"].fillna(0).astype(int)
    return merged.drop(columns=["ratio_median", "ratio_p10", "ratio_p90"])


def _in_order(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows grouped by `keys` in first-seen order (none: one group), then by variant in the
    canonical order, then by ranks."""
    group = frame.groupby(keys, sort=False).ngroup() if keys else 0
    rank = {v: k for k, v in enumerate(ordered(frame.variant))}
    return (frame.assign(_g=group, _v=frame.variant.map(rank))
            .sort_values(["_g", "_v", "ranks"], kind="stable").drop(columns=["_g", "_v"])
            .reset_index(drop=True))


def speedup_table(cells: pd.DataFrame, paired: pd.DataFrame | None = None,
                  figure: str = "speed-up") -> pd.DataFrame:
    """Figures 6 and 8: each variant's speed-up over the baseline per data set and rank count
    (groups in input order): the paired median where `paired` has the group, else the ratio
    of the median epoch times."""
    table = _in_order(cells, ["dataset", "ranks"])
    table["speedup"] = baseline_over(table, "epoch_time_s", "epoch_time_s", figure=figure)
    table = with_paired(table, read_paired([]) if paired is None else paired)
    return table[list(SPEEDUP_COLUMNS)]


def speedup_range(table: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """The error bar of each speed-up: the paired rounds' 10-90% range, or for a speed-up
    without rounds the baseline's median over the variant's slowest and fastest repeat."""
    paired = table["rounds"] > 0 if "rounds" in table else pd.Series(False, table.index)
    low = baseline_over(table, "epoch_time_s", "epoch_time_max_s")
    high = baseline_over(table, "epoch_time_s", "epoch_time_min_s")
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
    table = _in_order(cells, ["dataset"])
    table["strong_efficiency"] = strong_efficiency(table, "epoch_time_s")
    table = _paired_speedups(table, paired)
    return table[[*CELL_COLUMNS, "strong_efficiency", "speedup", *PAIRED_COLUMNS]]


def weak_scaling_table(cells: pd.DataFrame, paired: pd.DataFrame | None = None
                       ) -> pd.DataFrame:
    """Figure 10: epoch times as data set and ranks grow together, with the weak scaling
    efficiency per variant (the reference: its fewest ranks), and the paired speed-up."""
    table = _in_order(cells, [])
    table["weak_efficiency"] = weak_efficiency(table, "epoch_time_s")
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
            "valid_loss": epochs.valid_loss if "valid_loss" in epochs else math.nan}))
    return pd.concat(frames, ignore_index=True)


STEP_PARTS = ("compute_s", "optim_s", "wait_s", "allreduce_s", "data_s")


def straggler_table(paths: list[str | Path], skip_first_epoch: bool = True) -> pd.DataFrame:
    """Figure 13: per run and rank, the mean seconds per step of each part (steps.csv, the
    first epoch left out as warm-up when there are several), and the run's compute share."""
    frames = []
    for run in load_runs(paths):
        steps = run.steps()
        if skip_first_epoch and steps.epoch.nunique() > 1:
            steps = steps[steps.epoch != steps.epoch.min()]
        means = steps.groupby("rank")[list(STEP_PARTS)].mean().fillna(0.0).reset_index()
        total = means[list(STEP_PARTS)].to_numpy().sum()
        share = means.compute_s.sum() / total if total else math.nan
        frames.append(means.assign(dataset=run.dataset, variant=run.variant, ranks=run.ranks,
                                   compute_share=share))
    columns = ["dataset", "variant", "ranks", "rank", *STEP_PARTS, "compute_share"]
    return pd.concat(frames, ignore_index=True)[columns]
