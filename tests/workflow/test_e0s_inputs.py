"""An E0s file that config `train.settings` names (model.e0s, model.e0s_fixed) is an input of
every training rule: editing it makes the trainings outdated at `snakemake -n`, as an edited
graph shard does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import workflow_clone

CELL = "results/train/mini_s/kernel/r1/summary.json"
GROUP = "results/train/mini_s/r1/paired.csv"




def snakemake(repo: Path, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "snakemake", *args, "--configfile",
                             "config/e0s.yaml"], cwd=repo, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def finished(repo: Path, targets: list[str]) -> None:
    """Every output of `targets`' jobs present (empty files) and marked up to date."""
    (repo / "results/data/mini/frames").mkdir(parents=True)
    made = [f"results/graphs/mini/shard_000{k}.{ext}" for k in (0, 1) for ext in ("h5", "json")]
    made += ["results/graphs/mini/split.npz", CELL, GROUP, "results/train/mini_s/r1/rounds.csv"]
    made += [f"results/train/mini_s/r1/{v}/summary.json"
             for v in ("baseline", "balancer", "kernel", "both")]
    for name in made:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).touch()
    snakemake(repo, "--touch", "--cores", "1", *targets)


@pytest.mark.workflow
@pytest.mark.parametrize("key", ["e0s", "e0s_fixed"])
def test_an_edited_e0s_file_makes_the_trainings_outdated(tmp_path, key):
    repo = workflow_clone(tmp_path / "clone")
    e0s = tmp_path / "e0s.json"
    e0s.write_text(json.dumps({"Cu": -3.5}))
    value = str(e0s) if key == "e0s" else [str(e0s)]
    (repo / "config/e0s.yaml").write_text(json.dumps(
        {"train": {"settings": {"model": {key: value}}}}))
    finished(repo, [CELL, GROUP])
    assert "Nothing to be done" in snakemake(repo, "-n", CELL, GROUP)
    before = e0s.stat().st_mtime
    e0s.write_text(json.dumps({"Cu": -3.25}))
    os.utime(e0s, (before + 10, before + 10))  # as an edit a little later would date it
    planned = snakemake(repo, "-n", CELL, GROUP)
    assert f"reason: Updated input files: {e0s}" in planned
    for rule in ("train_cell", "train_group"):
        assert f"rule {rule}:" in planned
