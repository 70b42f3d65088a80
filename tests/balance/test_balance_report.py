"""`cfmtrain balance`: the packing-quality table from a size array, and the CLI on a tiny graph
store; `cfmtrain bench balance` on a small case."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from cfmtrain.balance.mixture import mixture_sizes
from cfmtrain.balance.report import VARIANTS, packing_table, write_report
from cfmtrain.bench.balance import measure_case


def test_packing_table_on_a_small_size_array():
    sizes, _ = mixture_sizes(3000, seed=0)
    table = packing_table(sizes, 3072, [8, 16], seed=1)
    assert len(table) == 2 * len(VARIANTS)
    paper = table[(table.strategy == "algorithm1") & (table.ranks == 8)].iloc[0]
    assert paper.bins % 8 == 0 and paper.max_load <= 3072 and paper.repeated == 1.0
    assert paper.excess_bins <= 8 and paper.step_balance > 0.99
    fixed = table[(table.strategy == "fixed_count") & (table.ranks == 8)].iloc[0]
    assert fixed.step_balance < paper.step_balance - 0.2  # the straggler problem of Figure 12
    refined = table[(table.strategy == "algorithm1+refine") & (table.ranks == 8)].iloc[0]
    assert refined.step_balance >= max(paper.step_balance, 0.999) and refined.repeated == 1.0
    randomised = table[(table.strategy == "algorithm1+refine+random") & (table.ranks == 8)].iloc[0]
    assert randomised.repeated < 0.05
    assert randomised.step_balance == pytest.approx(refined.step_balance, abs=1e-12)


def test_write_report_table_and_markdown(tmp_path):
    sizes, _ = mixture_sizes(600, seed=2)
    out = {k: tmp_path / f"x.{k}" for k in ("csv", "md")}
    write_report(sizes, capacity=3072, ranks=[8], seed=0, unit="atoms", dataset="mixture",
                 csv=out["csv"], markdown_path=out["md"])
    table = pd.read_csv(out["csv"])
    assert set(table.strategy) == {label for label, *_ in VARIANTS}
    text = out["md"].read_text()
    assert text.startswith("### Packing quality, mixture: 600 graphs")
    assert "| 8 | algorithm1 |" in text and "| 8 | algorithm1+refine |" in text
    assert "the paper's Algorithm 1 alone" in text


@pytest.mark.slow
def test_cli_reads_a_graph_store(tmp_path):
    """Through a real (tiny) shard written by the graph store's own writer."""
    from cfmtrain.graphs.store import write_shard

    rng = np.random.default_rng(0)
    graphs = []
    for k, n in enumerate(rng.integers(1, 40, 50)):
        e = 3 * n
        graphs.append({"positions": rng.random((n, 3)), "numbers": np.full(n, 29),
                       "forces": np.zeros((n, 3)), "edge_index": rng.integers(0, n, (2, e)),
                       "unit_shifts": np.zeros((e, 3), int), "cell": np.eye(3) * 10,
                       "pbc": np.array([True] * 3), "energy": -1.0, "stress": None,
                       "source_index": k, "subset": "small" if n < 20 else "large"})
    write_shard(tmp_path / "shard_0000.h5", graphs, cutoff=4.5)
    csv, md = tmp_path / "p.csv", tmp_path / "p.md"
    subprocess.run([sys.executable, "-m", "cfmtrain", "balance", "--graphs", str(tmp_path),
                    "--name", "tiny", "--capacity", "200", "--ranks", "4", "--measure", "linear",
                    "--a", "1", "--b", "0.5", "--csv", str(csv), "--markdown", str(md)],
                   check=True, capture_output=True)
    table = pd.read_csv(csv)
    assert (table[table.strategy == "algorithm1"].max_load <= 200).all()


def test_benchmark_case_reports_every_metric():
    sizes, _ = mixture_sizes(2000, seed=0)
    rows = measure_case(sizes, 8, 3072, seed=0, repeats=1)
    assert [r["strategy"] for r in rows] == [label for label, *_ in VARIANTS]
    for key in ("time_s", "cpu_s", "bins", "lower_bound", "mean_fill", "padding",
                "step_balance", "repeated", "excess_bins"):
        assert all(np.isfinite(r[key]) for r in rows), key
    assert rows[0]["pack_bins_s"] > 0 and rows[1]["pack_bins_s"] > 0
