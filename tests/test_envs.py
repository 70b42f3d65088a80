"""The conda environment for cluster users lists exactly pyproject's dependencies."""

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_conda_env_matches_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((ROOT / "envs" / "cfmtrain.yaml").read_text())
    pip_lists = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    assert len(pip_lists) == 1
    assert sorted(pip_lists[0]) == sorted(deps)
