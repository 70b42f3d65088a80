"""The workflow lints clean and every target plans (dry run) for both configs; bad config
keys are refused by the schema."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["all", "graphs", "stats", "balance", "benchmark", "ablation", "sweeps", "simulate",
           "figures"]


def snakemake(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_lint():
    result = snakemake("--lint")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations" in result.stdout + result.stderr


@pytest.mark.parametrize("config", ["config/config.yaml", "config/paper.yaml"])
def test_dry_run_every_target(config):
    # --forceall: plan every job even where an earlier run left results in the work tree
    result = snakemake("-n", "--forceall", *TARGETS, "--configfile", config)
    assert result.returncode == 0, result.stdout + result.stderr
    for rule in ("frames", "graph_shard", "split", "stats_dataset"):
        assert rule in result.stdout, (rule, result.stdout)


def test_unknown_config_key_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "config/config.yaml").read_text() + "\ncutof: 5.0\n")
    result = snakemake("-n", "--configfile", str(bad))
    assert result.returncode != 0
    assert "cutof" in result.stdout + result.stderr
