"""A paired-round group's tables (`cfmtrain rounds`): rounds.csv, each round's epoch time of every
variant, and paired.csv, each variant's per-round ratios; their records, rows and reader.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from cfmtrain.measure.paired import Ratio, Rounds
from cfmtrain.paper import BASELINE, BOTH
from cfmtrain.tables import Record, frame, read_table

REFERENCE, BEST = BASELINE.name, BOTH.name


@dataclasses.dataclass(frozen=True)
class RoundRecord(Record):
    """One variant's epoch in one round: the round and its place in the round's shuffled order
    (from 1; it breaks ties of the interleaving), its epoch time (its own steps), and the wall
    and CPU seconds of all its turns (validation included)."""

    round: int
    position: int
    variant: str
    epoch_s: float
    wall_s: float
    cpu_s: float

    TABLE = "rounds.csv"
    WRITER = "`cfmtrain rounds`"


@dataclasses.dataclass(frozen=True)
class PairedRecord(Record):
    """One variant against a reference over the group's rounds: the variant's median epoch time,
    the median of the per-round ratios (reference time over the variant's) with its 10-90%
    range, the rounds, the spread ((p90 - p10) / median) and the seed of the rounds' order."""

    dataset: str
    ranks: int
    variant: str
    reference: str
    epoch_time_s: float
    ratio_median: float
    ratio_p10: float
    ratio_p90: float
    rounds: int
    spread: float
    seed: int

    TABLE = "paired.csv"
    WRITER = "`cfmtrain rounds`"


def round_rows(rounds: Rounds) -> list[RoundRecord]:
    """rounds.csv: one row per round and variant, in the order they ran."""
    return [RoundRecord(**row) for row in rounds.rows("variant", "epoch_s")]


def paired_rows(rounds: Rounds, dataset: str, ranks: int) -> list[PairedRecord]:
    """paired.csv: every variant against the baseline (itself: 1), then `both` against each
    other variant."""
    pairs = [(REFERENCE, v) for v in rounds.names]
    if BEST in rounds.names:
        pairs += [(v, BEST) for v in rounds.names if v not in (REFERENCE, BEST)]
    rows = []
    for reference, variant in pairs:
        ratio = (Ratio.of(np.ones(len(rounds.seconds))) if reference == variant
                 else rounds.ratio(reference, variant))
        rows.append(PairedRecord(
            dataset=dataset, ranks=ranks, variant=variant, reference=reference,
            epoch_time_s=float(np.median(rounds.times(variant))), **ratio.columns(),
            spread=ratio.spread, seed=rounds.seed))
    return rows


def read_paired(paths: Sequence[str | Path]) -> pd.DataFrame:
    """The groups' paired.csv rows, one table (none given: no rows); a file lacking a column
    is an error naming it."""
    frames = [read_table(path, PairedRecord, empty_ok=True) for path in paths]
    if not frames:
        return frame([], PairedRecord)
    return pd.concat(frames, ignore_index=True)


def read_rounds(path: str | Path) -> pd.DataFrame:
    """A group's rounds.csv."""
    return read_table(path, RoundRecord)
