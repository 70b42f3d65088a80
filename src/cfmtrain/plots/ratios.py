"""Speed-ups and scaling efficiencies of per-epoch times, the paper's formulas, for measured
cells and simulated rows alike (one row per data set, variant and rank count).

- speed-up of a variant: the baseline's epoch time over the variant's, same data set and ranks;
- strong scaling efficiency (section 5.4.1): T_ref / ((N / N_ref) * T_N), the reference being
  the fewest ranks of the same data set and variant (the paper: 80 / (740/16 * 2) = 86.5%);
- weak scaling efficiency (section 5.4.2, work per rank held constant): T_ref / T_N, the
  reference being the variant's fewest ranks.
"""

from __future__ import annotations

import pandas as pd

from cfmtrain.paper import BASELINE


def baseline_over(frame: pd.DataFrame, base_column: str, own_column: str,
                  keys: tuple[str, ...] = ("dataset", "ranks"), figure: str = "") -> pd.Series:
    """The baseline's `base_column` over each row's `own_column`, the baseline being the row of
    variant `baseline` with the same `keys`; a group without one is an error naming it."""
    base = frame[frame.variant == BASELINE.name]
    if base.duplicated(list(keys)).any():
        raise ValueError(f"{figure}: more than one baseline row for the same {', '.join(keys)}")
    index = pd.MultiIndex.from_frame(frame[list(keys)])
    values = base.set_index(list(keys))[base_column].reindex(index)
    missing = values.isna().to_numpy()
    if missing.any():
        where = frame.loc[missing, list(keys)].drop_duplicates().to_dict("records")
        raise ValueError(f"{figure}: no baseline to compare against for {where}")
    return pd.Series(values.to_numpy() / frame[own_column].to_numpy(), index=frame.index)


def _reference(frame: pd.DataFrame, group: list[str]) -> pd.DataFrame:
    """Per row, the row of its group with the fewest ranks (an error if two tie)."""
    if frame.duplicated([*group, "ranks"]).any():
        raise ValueError(f"two rows with the same {', '.join(group)} and ranks")
    first = frame.loc[frame.groupby(group, sort=False).ranks.idxmin()]
    return frame[group].merge(first, on=group, how="left").set_index(frame.index)


def strong_efficiency(frame: pd.DataFrame, time: str,
                      group: tuple[str, ...] = ("dataset", "variant")) -> pd.Series:
    """T_ref * N_ref / (N * T_N) within each group, the reference at the group's fewest ranks."""
    ref = _reference(frame, list(group))
    return ref[time] * ref.ranks / (frame.ranks * frame[time])


def weak_efficiency(frame: pd.DataFrame, time: str,
                    group: tuple[str, ...] = ("variant",)) -> pd.Series:
    """T_ref / T_N within each group, the reference at the group's fewest ranks."""
    ref = _reference(frame, list(group))
    return ref[time] / frame[time]
