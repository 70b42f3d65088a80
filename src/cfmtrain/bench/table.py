"""Benchmark output: a printed table and a CSV under results/bench/."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cfmtrain.atomic import atomic_path


def report(rows: list[dict], csv_path: str | Path, title: str) -> pd.DataFrame:
    """Print `rows` as an aligned table under `title` and write them to `csv_path` atomically."""
    frame = pd.DataFrame(rows)
    print(f"\n{title}\n" + frame.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    with atomic_path(csv_path) as tmp:
        frame.to_csv(tmp, index=False)
    print(f"wrote {csv_path}")
    return frame
