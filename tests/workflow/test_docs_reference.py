"""The reference pages and the first screen: docs/cli.md lists every command and benchmark with
every argument its parser has, docs/api.md every public name of cfmtrain.kernels and
cfmtrain.balance, the config reference is generated once (config/README.md links to it); a
command prints no library warning; the renamed presets' old names still work, with a note; the
changelog's release matches CITATION.cff."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from helpers import REPO

from cfmtrain import docs, quiet
from cfmtrain.bench.cli import BENCHMARKS
from cfmtrain.commands import COMMANDS

ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
ENV.pop("PYTHONWARNINGS", None)  # as a user's shell has it


def sections(page: str) -> dict[str, str]:
    """A page's `## ` and `### ` sections by heading."""
    text = (REPO / page).read_text()
    parts = re.split(r"^#{2,3} (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.parametrize("argv", [["--help"], ["bench", "md", "--help"], ["docs", "--help"],
                                  pytest.param(["train", "--help"], marks=pytest.mark.slow)],
                         ids=" ".join)
def test_help_prints_no_library_warning(argv):
    result = subprocess.run([sys.executable, "-m", "cfmtrain", *argv], capture_output=True,
                            text=True, timeout=300, env=ENV, cwd=REPO)
    assert result.returncode == 0 and result.stdout.startswith("usage: cfmtrain")
    assert result.stderr == ""


def test_quiet_ignores_only_the_named_warnings():
    env: dict[str, str] = {"PYTHONWARNINGS": "default"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet.install(env)
        quiet.install(env)  # twice: no entry repeated
        warnings.warn_explicit(quiet.LIBRARY_WARNINGS[0][0] + ", forcing ...", UserWarning,
                               "_wigner.py", 10, module="e3nn.o3._wigner")
        warnings.warn_explicit(quiet.LIBRARY_WARNINGS[0][0], UserWarning, "x.py", 1,
                               module="cfmtrain.train.runner")  # another module's: printed
        warnings.warn("cfmtrain's own warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == [quiet.LIBRARY_WARNINGS[0][0],
                                                "cfmtrain's own warning"]
    entries = env["PYTHONWARNINGS"].split(",")
    assert entries[0] == "default" and entries[1:] == quiet.options()


def test_cli_page_has_every_command_and_argument():
    page = sections("docs/cli.md")
    for name, (module, _, _) in COMMANDS.items():
        assert f"`cfmtrain {name}`" in page, name
        parsers = [(f"`cfmtrain {name}`", module)] + (
            [(f"`cfmtrain bench {b}`", m) for b, m in BENCHMARKS.items()] if name == "bench"
            else [])
        for heading, mod in parsers:
            parser = argparse.ArgumentParser()
            importlib.import_module(mod).add_arguments(parser)
            flags = [s for a in parser._actions for s in a.option_strings if s not in ("-h",
                                                                                       "--help")]
            missing = [f for f in flags if f"`{f}" not in page[heading]
                       and f", {f}" not in page[heading]]
            assert missing == [], (heading, missing)


def test_api_page_has_every_public_name_with_its_docstring():
    page = (REPO / "docs/api.md").read_text()
    for module_name in docs.API:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            assert f"### `{name}`" in page, (module_name, name)
    assert "def " not in page and "'torch.nn.Module'" not in page  # signatures, unquoted


def test_config_reference_is_generated_once():
    short = (REPO / "config/README.md").read_text()
    assert "(../docs/configuration.md)" in short and "| `" not in short
    assert len(short.splitlines()) < 30
    assert "<!-- cfmtrain docs: config -->" in (REPO / "docs/configuration.md").read_text()


@pytest.mark.parametrize("command,old,new", [("kernels", "goals", "paper-model"),
                                             ("md", "goals", "paper-model")])
def test_renamed_preset_is_accepted_with_a_note(command, old, new, capsys):
    parser = argparse.ArgumentParser()
    importlib.import_module(BENCHMARKS[command]).add_arguments(parser)
    assert parser.parse_args(["--preset", old]).preset == new
    assert f"preset `{old}` is now called `{new}`" in capsys.readouterr().err
    assert parser.parse_args(["--preset", new]).preset == new
    assert capsys.readouterr().err == ""


def test_accuracy_preset_old_name_maps_to_medium(capsys):
    from cfmtrain.bench.accuracy import PRESETS
    from cfmtrain.bench.settings import preset_name

    assert preset_name("accuracy")("goals") == "medium" and "medium" in PRESETS
    assert "is now called `medium`" in capsys.readouterr().err
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    assert config["accuracy"]["preset"] == "medium"


def test_changelog_release_matches_the_citation():
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    version, date = citation["version"], str(citation["date-released"])
    text = (REPO / "CHANGELOG.md").read_text()
    assert f"\n## {version} - {date}\n" in text
    assert text.index("## Unreleased") < text.index(f"## {version}")
    release = text.split(f"## {version}", 1)[1]
    assert "Removed" not in release  # a first release lists nothing added, then removed
