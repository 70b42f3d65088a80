"""A real run of the workflow on a tiny `mini` config: frames -> graphs -> split -> stats."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import REPO

from cfmtrain.graphs.split import load_split
from cfmtrain.graphs.store import GraphStore

pytestmark = pytest.mark.workflow  # runs Snakemake



def test_tiny_pipeline_builds_graphs_and_stats(tmp_path):
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config["datasets"]["mini"].update(scale=0.05, shards=2)
    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
         "--directory", str(tmp_path), "--cores", "2", "graphs", "stats",
         "--configfile", str(config_file)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    store = GraphStore(tmp_path / "results/graphs/mini")
    assert len(store) >= 8 and len(store.files) == 2
    assert set(store.subset_names) >= {"water_clusters", "liquid_water", "mptrj", "cuni"}
    split = load_split(tmp_path / "results/graphs/mini/split.npz")
    everything = np.concatenate([split["train"], split["valid"], split["test"]])
    np.testing.assert_array_equal(np.sort(everything), np.arange(len(store)))
    table = (tmp_path / "results/stats/mini/table3.md").read_text()
    assert "liquid_water" in table and "| total |" in table
    check_table3(pd.read_csv(tmp_path / "results/stats/mini/table3.csv"), store)
    for suffix in (".png", ".pdf"):
        assert (tmp_path / f"results/figures/fig05_sizes_mini{suffix}").stat().st_size > 1000


def check_table3(table: pd.DataFrame, store: GraphStore) -> None:
    """Table 3's numbers equal those recomputed here from the graphs themselves."""
    atoms = np.array([len(store[i]["numbers"]) for i in range(len(store))])
    edges = np.array([store[i]["edge_index"].shape[1] for i in range(len(store))])
    np.testing.assert_array_equal(atoms, store.num_atoms)
    np.testing.assert_array_equal(edges, store.num_edges)
    names = np.array([store.subset_names[s] for s in store.subsets])
    expected = {"total": np.ones(len(store), bool)}
    expected.update({n: names == n for n in store.subset_names if (names == n).any()})
    assert list(table["subset"]) == [*list(expected)[1:], "total"]
    for row in table.itertuples():
        mask = expected[row.subset]
        assert row.graphs == mask.sum(), row
        assert row.share == pytest.approx(mask.sum() / len(store), rel=1e-12), row
        assert (row.atoms_min, row.atoms_max) == (atoms[mask].min(), atoms[mask].max()), row
        assert (row.edges_min, row.edges_max) == (edges[mask].min(), edges[mask].max()), row
        assert row.mean_neighbours == pytest.approx(edges[mask].sum() / atoms[mask].sum(),
                                                    rel=1e-12), row
