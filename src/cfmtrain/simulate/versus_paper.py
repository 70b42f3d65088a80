"""The simulated numbers beside the paper's reported ones (section 5.4 and the conclusion), with
their bands and the assumptions that produced them: versus_paper.csv, and as Markdown; a case
whose models are not supported says so and why instead of giving numbers."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from cfmtrain.paper import BASELINE, BOTH, EPOCH_MINUTES, PAPER_RANKS, SPEEDUP, STRONG_EFFICIENCY
from cfmtrain.tables import Record


@dataclasses.dataclass(frozen=True)
class VersusPaperRow(Record):
    """versus_paper.csv: one of the paper's reported quantities beside the simulator's, in one
    case (CPU measured or accelerator assumed), with the simulated band; the simulated values
    are empty where the case's headline variants are not supported."""

    case: str
    quantity: str
    paper: float
    simulated: float
    low: float
    high: float
    supported: bool

    TABLE = "versus_paper.csv"
    WRITER = "`cfmtrain simulate`"

HEADLINE = (BASELINE.name, BOTH.name)  # the variants of the paper's headline numbers


def _time(table: pd.DataFrame, variant: str, ranks: int) -> tuple[float, float, float]:
    """(epoch_s, low, high) of a variant's own row at `ranks`; NaN when not simulated."""
    rows = table[(table.run == variant) & (table.ranks == ranks)]
    if rows.empty:
        return (float("nan"),) * 3
    row = rows.iloc[0]
    return float(row.epoch_s), float(row.epoch_s_low), float(row.epoch_s_high)


def comparison(strong: pd.DataFrame) -> pd.DataFrame:
    """Rows of (quantity, paper, simulated, low, high) from the simulator's strong-scaling table;
    a ratio's band pairs the ends of its two bands (low numerator over high denominator)."""
    base, both, top = BASELINE.name, BOTH.name, PAPER_RANKS
    b740, f740 = _time(strong, base, top), _time(strong, both, top)
    b64, f64 = _time(strong, base, 64), _time(strong, both, 64)
    f16 = _time(strong, both, 16)

    def minutes(t):
        return tuple(v / 60 for v in t)

    def ratio(num, den, k=1.0):
        return num[0] / den[0] * k, num[1] / den[2] * k, num[2] / den[1] * k

    paper = EPOCH_MINUTES
    rows = [
        (f"baseline min/epoch, {top} ranks", paper[base, top], *minutes(b740)),
        (f"balancer+kernels min/epoch, {top} ranks", paper[both, top], *minutes(f740)),
        (f"speedup at {top} ranks (x)", SPEEDUP, *ratio(b740, f740)),
        ("baseline min/epoch, 64 ranks", paper[base, 64], *minutes(b64)),
        ("balancer+kernels min/epoch, 64 ranks", paper[both, 64], *minutes(f64)),
        ("speedup at 64 ranks (x)", paper[base, 64] / paper[both, 64], *ratio(b64, f64)),
        ("balancer+kernels min/epoch, 16 ranks", paper[both, 16], *minutes(f16)),
        (f"strong-scaling efficiency 16 -> {top}, balancer+kernels", STRONG_EFFICIENCY,
         *ratio(f16, f740, 16 / top)),
    ]
    return pd.DataFrame(rows, columns=["quantity", "paper", "simulated", "low", "high"])


def _weak(strong: pd.DataFrame) -> pd.DataFrame:
    """The headline variants' own rows that are not supported."""
    own = strong[strong.run.isin(HEADLINE) & (strong.run == strong.variant)]
    return own[~own.supported.astype(bool)]


def rows(case: str, strong: pd.DataFrame) -> list[VersusPaperRow]:
    """versus_paper.csv's rows of one case (simulated values NaN where unsupported)."""
    supported = _weak(strong).empty
    return [VersusPaperRow(case, r.quantity, r.paper,
                           *((r.simulated, r.low, r.high) if supported else (math.nan,) * 3),
                           supported) for r in comparison(strong).itertuples()]


def section(title: str, strong: pd.DataFrame) -> str:
    """One case's comparison, or "unsupported" with the reasons of the headline
    variants' rows when either is unsupported."""
    weak = _weak(strong)
    if not weak.empty:
        reasons = "; ".join(dict.fromkeys(f"{r.variant}: {r.unsupported_reason}"
                                          for r in weak.itertuples()))
        return (f"## {title}\n\n**Unsupported.** No simulated numbers are given, "
                f"because {reasons}.\n")
    lines = ["| quantity | paper | simulated | band |", "|---|---:|---:|---|"]
    for r in comparison(strong).itertuples():
        lines.append(f"| {r.quantity} | {r.paper:.3g} | {r.simulated:.3g} | "
                     f"{r.low:.3g} – {r.high:.3g} |")
    return f"## {title}\n\n" + "\n".join(lines) + "\n"


def markdown(sections: list[str], assumptions: list[str]) -> str:
    """The cases' sections, followed by the stated assumptions."""
    notes = "\n".join(f"- {a}" for a in assumptions)
    return ("# Simulated scaling beside the paper's reported numbers\n\n" + "\n".join(sections)
            + "\nAssumptions:\n\n" + notes + "\n")
