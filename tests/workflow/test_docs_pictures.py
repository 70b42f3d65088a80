"""The documentation's pictures (docs/figures/): each is there, small, and what `cfmtrain docs`
draws from the current reference CSVs with the current figure code (its recorded digests), the
rule graph's source is the workflow's own, and the pages show them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from helpers import REPO

from cfmtrain import docs
from cfmtrain.plots.rulegraph import rulegraph_edges


@pytest.mark.parametrize("picture", docs.PICTURES, ids=lambda p: p.name)
def test_picture_is_current_and_small(picture):
    png = REPO / docs.FIGURES / f"{picture.name}.png"
    assert png.is_file() and png.stat().st_size < 150_000
    assert picture not in docs.stale_pictures(REPO)
    entry = json.loads((REPO / docs.DIGESTS).read_text())[picture.name]
    assert entry["source"] == docs.picture_digest(REPO, picture)


def test_a_changed_source_makes_its_picture_stale_and_docs_redraws_it(tmp_path):
    for path in (docs.FIGURES, docs.REFERENCE):
        shutil.copytree(REPO / path, tmp_path / path)
    assert docs.stale_pictures(tmp_path) == []
    csv = tmp_path / docs.REFERENCE / "ablation.csv"
    csv.write_text(csv.read_text().replace("mini_m", "mini_l"))
    stale = docs.stale_pictures(tmp_path)
    assert [p.name for p in stale] == ["ablation"]
    docs.draw_pictures(tmp_path, stale)
    assert docs.stale_pictures(tmp_path) == []
    assert (tmp_path / docs.FIGURES / "ablation.png").read_bytes() != (
        REPO / docs.FIGURES / "ablation.png").read_bytes()


@pytest.mark.slow
def test_rulegraph_source_is_the_workflows(tmp_path):
    """docs/figures/rulegraph.dot has the rules and edges of `snakemake --rulegraph dot all`
    (refresh: `snakemake --cores 1 --rulegraph dot all > docs/figures/rulegraph.dot`)."""
    result = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--rulegraph",
                             "dot", "all"], cwd=REPO, capture_output=True, text=True, check=True)
    committed = (REPO / docs.RULEGRAPH).read_text()
    assert rulegraph_edges(committed) == rulegraph_edges(result.stdout)


def test_pages_show_the_pictures():
    index = (REPO / "docs/index.md").read_text()
    for picture in docs.PICTURES:
        assert f"(figures/{picture.name}.png)" in index
    readme = (REPO / "README.md").read_text()
    assert "(docs/figures/ablation.png)" in readme and "(docs/figures/rulegraph.png)" in readme
