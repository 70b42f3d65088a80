"""Every command in README.md's bash blocks is one that a test or CI exercises: `make` (CI runs
`make test`), `snakemake` (planned here as written with the default config, and with their own
configs by tests/workflow/test_own_files.py), `python -m pytest` of test files that exist; and in
README.md and docs/*.md, `cfmtrain bench` and `cfmtrain figure` lines read by the command's own
argument parser, and `cfmtrain goals` lines run as written on a results folder of known cells."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import subprocess
import sys

import pytest
from helpers import REPO

from cfmtrain.bench.cli import BENCHMARKS
from cfmtrain.plots import cli as figure_cli


def readme_commands(pages: tuple[str, ...] = ("README.md",)) -> list[str]:
    """The command lines of the pages' ```bash blocks, comments dropped."""
    text = "\n".join((REPO / page).read_text() for page in pages)
    lines = [line.split("#")[0].strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)
             for line in block.splitlines()]
    return [line for line in lines if line]


# README.md and every docs page: their bench, figure and goals lines are run or parsed here
PAGES = ("README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")))


def test_readme_has_commands_of_known_kinds():
    commands = readme_commands()
    assert {"make run", "make test"} <= set(commands)
    kinds = ("make ", "snakemake ", "python -m pytest ", "cfmtrain bench ", "cfmtrain figure ",
             "cfmtrain goals ")
    assert [c for c in commands if not c.startswith(kinds)] == []


@pytest.mark.parametrize("command", [c for c in readme_commands(PAGES)
                                     if c.startswith("cfmtrain bench ")])
def test_readme_bench_commands_parse(command):
    words = shlex.split(command)
    module = importlib.import_module(BENCHMARKS[words[2]])
    parser = argparse.ArgumentParser(exit_on_error=False)
    module.add_arguments(parser)
    args = parser.parse_args(words[3:])
    given = getattr(args, "graphs", None)  # stores (paths), or counts (int) to generate
    stores = [g for g in (given if isinstance(given, list) else [given])
              if g is not None and not isinstance(g, int)]
    assert all(str(g).startswith("results/graphs/") for g in stores), stores  # not counts


def test_readme_pytest_commands_name_existing_tests():
    files = [w for c in readme_commands() if c.startswith("python -m pytest ")
             for w in shlex.split(c)[3:] if not w.startswith("-")]
    assert files and all((REPO / f).is_file() for f in files), files


@pytest.mark.parametrize("command", [c for c in readme_commands(PAGES)
                                     if c.startswith("cfmtrain figure ")])
def test_readme_figure_commands_parse(command):
    parser = argparse.ArgumentParser(exit_on_error=False)
    figure_cli.add_arguments(parser)
    args = parser.parse_args(shlex.split(command)[2:])
    assert args.name in figure_cli.FIGURES


@pytest.mark.workflow
@pytest.mark.parametrize("command", [c for c in readme_commands() if c.startswith("snakemake ")
                                     and "--configfile" not in c])
def test_readme_snakemake_commands_plan(command):
    """A dry run of the command as written (the default config; the lines with their own
    config are planned in tests/workflow/test_own_files.py)."""
    result = subprocess.run([sys.executable, "-m", *shlex.split(command), "-n"], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("command", [c for c in readme_commands(PAGES)
                                     if c.startswith("cfmtrain goals ")])
def test_readme_goals_commands_run(command, tmp_path):
    """The line as written, in a folder whose `results` holds one run's groups that meet the
    goals (helpers.GOOD, as in tests/plots/test_ablation_goals.py), then again with `both` on mini_m
    slower than `kernel`: exit 0, then 1."""
    from helpers import GOOD, write_goal_run

    write_goal_run(tmp_path / "results")
    words = shlex.split(command)
    result = subprocess.run([sys.executable, "-m", "cfmtrain", *words[1:]], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout and "checks passed over 1 run(s)" in result.stderr
    write_goal_run(tmp_path / "results", {("mini_m", 2): {**GOOD[("mini_m", 2)], "both": 6.0}})
    result = subprocess.run([sys.executable, "-m", "cfmtrain", *words[1:]], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "both first    mini_m r2 both/kernel p10" in result.stdout and "FAILED" in result.stdout
