"""The documentation's paths and defaults are the pipeline's: each results path or glob that a
documented `cfmtrain figure --inputs` line names matches a file the default target's DAG declares
(what `make run` makes; a `snakemake -f` target is planned as written by test_docs.py), and
each default docs/configuration.md shows for a key of config/config.yaml is that file's value."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from helpers import REPO
from test_docs import commands

from cfmtrain import docs


def documented_paths() -> list[str]:
    """The results paths of the documented figure inputs."""
    paths = []
    for command in commands():
        words = shlex.split(command)
        if words[:2] == ["cfmtrain", "figure"] and "--inputs" in words:
            rest = words[words.index("--inputs") + 1:]
            paths += [w for w in rest[:next((k for k, w in enumerate(rest) if w.startswith("-")),
                                            len(rest))]]
    return [p for p in paths if p.startswith("results/")]


@pytest.fixture(scope="module")
def declared() -> list[str]:
    """Every file of the default target's DAG (`snakemake -n --summary`)."""
    out = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "-n", "--summary",
                          "all"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [line.split("\t")[0] for line in out.splitlines()[1:] if line.strip()]


def test_documented_paths_are_found():
    assert documented_paths()


@pytest.mark.workflow
@pytest.mark.parametrize("path", documented_paths())
def test_documented_path_is_an_output_of_make_run(path, declared):
    assert any(fnmatch.fnmatchcase(f, path) for f in declared), path


def leaves(node: dict, prefix: str = ""):
    for key, value in node.items():
        if isinstance(value, dict) and key not in ("datasets",):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def test_documented_defaults_are_the_shipped_config():
    shipped = yaml.safe_load((REPO / docs.CONFIG).read_text())
    text = (REPO / "docs/configuration.md").read_text()
    for key, value in leaves(shipped):
        row = re.search(rf"^\| `{re.escape(key)}` \| [^|]* \| ([^|]*) \|", text, re.M)
        if row and row.group(1).strip():
            assert row.group(1).strip() == f"`{docs._flat(value)}`", key
