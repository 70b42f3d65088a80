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

REQUIRED = ("variant", "ranks", "epoch_s")
SIMULATED_COLUMNS = ("dataset", "ranks", "variant", "epoch_s", "epoch_s_low", "epoch_s_high",
                     "supported", "unsupported_reason")


def _truth(value) -> bool:
    if isinstance(value, str):
        if value.strip().lower() in ("true", "1", "yes"):
            return True
        if value.strip().lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"not true or false: {value!r}")
    return bool(value)


def read_simulated(path: str | Path) -> pd.DataFrame:
    """A simulator table, the variants' own rows (not the extra strategy runs), as
    SIMULATED_COLUMNS; `dataset` is 'simulated' where the table has none."""
    frame = pd.read_csv(path)
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: not a simulator table, missing columns {missing}")
    if frame.empty:
        raise ValueError(f"{path}: no rows")
    if "run" in frame:
        frame = frame[frame.run == frame.variant]  # the variants' own pairing, not the extras
    frame = frame.assign(dataset=frame["dataset"] if "dataset" in frame else "simulated")
    for side in ("epoch_s_low", "epoch_s_high"):
        if side not in frame:
            frame[side] = frame.epoch_s
    try:
        frame["supported"] = (frame.supported.map(_truth) if "supported" in frame else True)
    except ValueError as err:
        raise ValueError(f"{path}: column supported: {err}") from None
    reason = frame["unsupported_reason"] if "unsupported_reason" in frame else ""
    reason = pd.Series(reason, index=frame.index, dtype=object)
    frame["unsupported_reason"] = reason.fillna("").astype(str)
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
    out["speedup"] = baseline_over(out, "epoch_s", "epoch_s", figure="simulated Figure 8")
    out["speedup_low"] = baseline_over(out, "epoch_s_low", "epoch_s_high").where(~base, 1.0)
    out["speedup_high"] = baseline_over(out, "epoch_s_high", "epoch_s_low").where(~base, 1.0)
    return out


def simulated_strong_table(table: pd.DataFrame) -> pd.DataFrame:
    """Simulated Figure 7, with the strong scaling efficiency per variant."""
    return table.assign(strong_efficiency=strong_efficiency(table, "epoch_s"))


def simulated_weak_table(table: pd.DataFrame) -> pd.DataFrame:
    """Simulated Figure 10, with the weak scaling efficiency per variant."""
    return table.assign(weak_efficiency=weak_efficiency(table, "epoch_s"))


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
