"""A results folder that two clones of other settings share: outputs record the settings they
were made with (a frames manifest its shard count, a graph shard its cutoff, a split its
fractions and seed), and a clone whose config asks for others plans to rebuild them at
`snakemake -n`, naming each and why, instead of using the other clone's as its own; a setting
changed in the clone that built them rebuilds them as before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ase.io
import numpy as np
import pytest
from helpers import emt_frames, workflow_clone


def clone(folder: Path, overlay: str) -> Path:
    """A stand-in for a clone (helpers.workflow_clone) with config/own.yaml."""
    workflow_clone(folder)
    (folder / "config/own.yaml").write_text(overlay)
    return folder


def snakemake(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args, "--configfile", "config/own.yaml"],
        cwd=repo, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})


def planned(repo: Path) -> tuple[dict[str, int], str]:
    """The dry run of `graphs`: jobs per rule, and its output (whitespace collapsed)."""
    result = snakemake(repo, "-n", "graphs")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    if "Nothing to be done" in output:
        return {}, output
    lines = output[output.index("Job stats:"):].splitlines()[3:]
    jobs = {}
    for line in lines[:next(k for k, line in enumerate(lines) if line.startswith("total"))]:
        rule, count = line.split()
        jobs[rule] = int(count)
    return jobs, " ".join(output.split())


@pytest.mark.workflow
def test_a_clone_of_other_settings_rebuilds_what_the_shared_results_hold(tmp_path):
    data = tmp_path / "lab/cells.extxyz"  # both clones read the same file
    data.parent.mkdir()
    ase.io.write(data, emt_frames(12, seed=7))
    dataset = f"datasets:\n  own: {{kind: files, paths: ['{data}'], shards: 2}}\n"
    settings = "targets: [own]\ncutoff: 4.0\nsplit: {valid: 0.2, test: 0.2, seed: 1}\n"
    built = clone(tmp_path / "built", dataset + settings)
    done = snakemake(built, "--cores", "2", "graphs")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert planned(built)[0] == {}

    def sharing(name: str, overlay: str) -> Path:
        other = clone(tmp_path / name, overlay)
        (other / "results").symlink_to(built / "results")
        return other

    # another split seed: the split is made again, named
    seed = sharing("seed", dataset + settings.replace("seed: 1", "seed: 2"))
    jobs, text = planned(seed)
    assert jobs == {"split": 1, "graphs": 1}
    assert ("results/graphs/own/split.npz: rebuilt: made with seed 1 (this config: 2). If "
            "another clone or config shares this results folder, its "
            "results/graphs/own/split.npz is replaced") in text
    # another shard count: the frames (two shards where three are asked) and all after them
    jobs, text = planned(sharing("shards", dataset.replace("shards: 2", "shards: 3") + settings))
    assert jobs == {"frames": 1, "graph_shard": 3, "split": 1, "graphs": 1}
    assert "results/data/own/frames: rebuilt: made with shards 2 (this config: 3)" in text
    # another cutoff: the graphs and their split, naming the folder
    jobs, text = planned(sharing("cutoff", dataset + settings.replace("4.0", "4.6")))
    assert jobs == {"graph_shard": 2, "split": 1, "graphs": 1}
    assert ("results/graphs/own/shard_0000.h5: rebuilt: made with cutoff 4.0 (this config: "
            "4.6). If another clone or config shares this results folder, its "
            "results/graphs/own is replaced") in text
    # rebuilt for real, the split is the seed clone's; then nothing is left to do there
    assert snakemake(seed, "--cores", "1", "graphs").returncode == 0
    assert int(np.load(built / "results/graphs/own/split.npz")["seed"]) == 2
    assert planned(seed)[0] == {}
    # the clone that built them, its cutoff changed: rebuilt as before
    (built / "config/own.yaml").write_text(dataset + settings.replace("4.0", "4.6"))
    assert planned(built)[0] == {"graph_shard": 2, "split": 1, "graphs": 1}
