"""The simulated numbers beside the paper's reported ones (section 5.4 and the conclusion), with
the assumptions that produced them, as Markdown."""

from __future__ import annotations

import pandas as pd

# The paper's reported numbers (never used to fit anything here).
PAPER = {
    "baseline_740_min": 12.0, "both_740_min": 2.0, "speedup_740": 6.0,
    "baseline_64_min": 100.0, "both_64_min": 18.0, "both_16_min": 80.0,
    "strong_efficiency_16_740": 0.865,
}


def _time(table: pd.DataFrame, variant: str, ranks: int) -> float:
    rows = table[(table.run == variant) & (table.ranks == ranks)]
    return float(rows.epoch_s.iloc[0]) if not rows.empty else float("nan")


def comparison(strong: pd.DataFrame) -> pd.DataFrame:
    """Rows of (quantity, paper, simulated) from the strong-scaling table of the simulator."""
    b740, f740 = _time(strong, "baseline", 740), _time(strong, "both", 740)
    b64, f64 = _time(strong, "baseline", 64), _time(strong, "both", 64)
    f16 = _time(strong, "both", 16)
    rows = [
        ("baseline min/epoch, 740 ranks", PAPER["baseline_740_min"], b740 / 60),
        ("balancer+kernels min/epoch, 740 ranks", PAPER["both_740_min"], f740 / 60),
        ("speedup at 740 ranks (x)", PAPER["speedup_740"], b740 / f740),
        ("baseline min/epoch, 64 ranks", PAPER["baseline_64_min"], b64 / 60),
        ("balancer+kernels min/epoch, 64 ranks", PAPER["both_64_min"], f64 / 60),
        ("speedup at 64 ranks (x)", PAPER["baseline_64_min"] / PAPER["both_64_min"], b64 / f64),
        ("balancer+kernels min/epoch, 16 ranks", PAPER["both_16_min"], f16 / 60),
        ("strong-scaling efficiency 16 -> 740, balancer+kernels",
         PAPER["strong_efficiency_16_740"], f16 * 16 / (f740 * 740)),
    ]
    return pd.DataFrame(rows, columns=["quantity", "paper", "simulated"])


def markdown(table: pd.DataFrame, assumptions: list[str]) -> str:
    """The comparison as Markdown, followed by the stated assumptions."""
    lines = ["| quantity | paper | simulated |", "|---|---:|---:|"]
    for r in table.itertuples():
        lines.append(f"| {r.quantity} | {r.paper:.3g} | {r.simulated:.3g} |")
    notes = "\n".join(f"- {a}" for a in assumptions)
    return ("# Simulated scaling beside the paper's reported numbers\n\n"
            + "\n".join(lines) + "\n\nAssumptions:\n\n" + notes + "\n")
