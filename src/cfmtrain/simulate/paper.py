"""The simulated numbers beside the paper's reported ones (section 5.4 and the conclusion), with
their bands and the assumptions that produced them, as Markdown; a case whose fit is too weak
says so and why instead of giving numbers."""

from __future__ import annotations

import pandas as pd

# The paper's reported numbers (never used to fit anything here).
PAPER = {
    "baseline_740_min": 12.0, "both_740_min": 2.0, "speedup_740": 6.0,
    "baseline_64_min": 100.0, "both_64_min": 18.0, "both_16_min": 80.0,
    "strong_efficiency_16_740": 0.865,
}
HEADLINE = ("baseline", "both")  # the variants of the paper's headline numbers


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
    b740, f740 = _time(strong, "baseline", 740), _time(strong, "both", 740)
    b64, f64 = _time(strong, "baseline", 64), _time(strong, "both", 64)
    f16 = _time(strong, "both", 16)

    def minutes(t):
        return tuple(v / 60 for v in t)

    def ratio(num, den, k=1.0):
        return num[0] / den[0] * k, num[1] / den[2] * k, num[2] / den[1] * k

    rows = [
        ("baseline min/epoch, 740 ranks", PAPER["baseline_740_min"], *minutes(b740)),
        ("balancer+kernels min/epoch, 740 ranks", PAPER["both_740_min"], *minutes(f740)),
        ("speedup at 740 ranks (x)", PAPER["speedup_740"], *ratio(b740, f740)),
        ("baseline min/epoch, 64 ranks", PAPER["baseline_64_min"], *minutes(b64)),
        ("balancer+kernels min/epoch, 64 ranks", PAPER["both_64_min"], *minutes(f64)),
        ("speedup at 64 ranks (x)", PAPER["baseline_64_min"] / PAPER["both_64_min"],
         *ratio(b64, f64)),
        ("balancer+kernels min/epoch, 16 ranks", PAPER["both_16_min"], *minutes(f16)),
        ("strong-scaling efficiency 16 -> 740, balancer+kernels",
         PAPER["strong_efficiency_16_740"], *ratio(f16, f740, 16 / 740)),
    ]
    return pd.DataFrame(rows, columns=["quantity", "paper", "simulated", "low", "high"])


def section(title: str, strong: pd.DataFrame) -> str:
    """One case's comparison, or "unsupported: fit too weak" with the reasons of the headline
    variants' rows when either is unsupported."""
    own = strong[strong.run.isin(HEADLINE) & (strong.run == strong.variant)]
    weak = own[~own.supported.astype(bool)]
    if not weak.empty:
        reasons = "; ".join(dict.fromkeys(f"{r.variant}: {r.unsupported_reason}"
                                          for r in weak.itertuples()))
        return (f"## {title}\n\n**Unsupported: fit too weak.** No simulated numbers are given, "
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
