"""The simulator's tables (results/simulate/<set>/<dist>/strong.csv, weak.csv) as the tidy
tables of the simulated Figures 7, 8 and 10: epoch time with the fit's band, speed-ups with
theirs, scaling efficiencies, and whether the fit supports the numbers at all. A table of the
format before the band (no epoch_s_low/high, supported) counts as supported, without a band.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cfmtrain.paper import BASELINE, BOTH
from cfmtrain.plots.ratios import baseline_over, strong_efficiency, weak_efficiency
from cfmtrain.simulate.records import EpochRow, StrategyRow, WeakRow
from cfmtrain.tables import read_table

EPOCH, JUDGED, WEAK = EpochRow.col, StrategyRow.col, WeakRow.col
EPOCH_TIMES = (EPOCH.epoch_s, EPOCH.epoch_s_low, EPOCH.epoch_s_high)  # the time and its band
SIMULATED_COLUMNS = (WEAK.dataset, EPOCH.ranks, EPOCH.variant, *EPOCH_TIMES, JUDGED.supported,
                     JUDGED.unsupported_reason)


def _truth(value) -> bool:
    if isinstance(value, str):
        if value.strip().lower() in ("true", "1", "yes"):
            return True
        if value.strip().lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"not true or false: {value!r}")
    return bool(value)


def read_simulated(path: str | Path) -> pd.DataFrame:
    """A simulator table (strong.csv or weak.csv), the variants' own rows (not the extra
    strategy runs), as SIMULATED_COLUMNS; `dataset` is 'simulated' where the table has none
    (strong.csv), and a table from before the band and the verdict has its epoch time as its
    band and counts as supported."""
    frame = read_table(path, EpochRow)
    frame = frame[frame.run == frame.variant]  # the variants' own pairing, not the extras
    frame = frame.assign(dataset=frame[WEAK.dataset] if WEAK.dataset in frame else "simulated")
    for side in EPOCH_TIMES[1:]:
        if side not in frame:
            frame[side] = frame.epoch_s
    supported, why = JUDGED.supported, JUDGED.unsupported_reason
    try:
        frame[supported] = (frame.supported.map(_truth) if supported in frame else True)
    except ValueError as err:
        raise ValueError(f"{path}: column {supported}: {err}") from None
    reason = frame[why] if why in frame else ""
    reason = pd.Series(reason, index=frame.index, dtype=object)
    frame[why] = reason.fillna("").astype(str)
    bad = ~((frame.epoch_s_low <= frame.epoch_s) & (frame.epoch_s <= frame.epoch_s_high))
    if bad.any():
        raise ValueError(f"{path}: epoch_s outside [epoch_s_low, epoch_s_high] in rows "
                         f"{frame.index[bad].tolist()}")
    return frame[list(SIMULATED_COLUMNS)].reset_index(drop=True)


def unsupported(table: pd.DataFrame) -> str:
    """'' when every row is supported, else the distinct reasons of the rows that are not."""
    rows = table[~table.supported.astype(bool)]
    if rows.empty:
        return ""
    reasons = list(dict.fromkeys(r for r in rows.unsupported_reason if r))
    return "; ".join(reasons) or "no reason given"


def simulated_speedup_table(table: pd.DataFrame) -> pd.DataFrame:
    """Simulated Figure 8: the baseline's epoch time over each variant's at each rank count,
    the band from the ends of both bands (baseline low over variant high, and high over low;
    the baseline's own speed-up is 1 exactly)."""
    out = table.copy()
    base = out.variant == BASELINE.name
    mid, low, high = EPOCH_TIMES
    out["speedup"] = baseline_over(out, mid, mid, figure="simulated Figure 8")
    out["speedup_low"] = baseline_over(out, low, high).where(~base, 1.0)
    out["speedup_high"] = baseline_over(out, high, low).where(~base, 1.0)
    return out


def simulated_strong_table(table: pd.DataFrame) -> pd.DataFrame:
    """Simulated Figure 7, with the strong scaling efficiency per variant."""
    return table.assign(strong_efficiency=strong_efficiency(table, EPOCH.epoch_s))


def simulated_weak_table(table: pd.DataFrame) -> pd.DataFrame:
    """Simulated Figure 10, with the weak scaling efficiency per variant."""
    return table.assign(weak_efficiency=weak_efficiency(table, EPOCH.epoch_s))


def headline(table: pd.DataFrame) -> dict | None:
    """The speed-up of balancer + kernels (`both`) over the baseline at the most ranks, with
    its band; None when the table has no such row or the fit does not support it."""
    if unsupported(table):
        return None
    rows = table[table.variant == BOTH.name]
    if rows.empty or "speedup" not in rows:
        return None
    row = rows.loc[rows.ranks.idxmax()]
    return {"ranks": int(row.ranks), "speedup": float(row.speedup),
            "low": float(row.speedup_low), "high": float(row.speedup_high)}
