"""The documentation: the generated parts equal what `cfmtrain docs` writes (the README's results
table from the reference CSVs, the config reference with every schema key and training key), and
every command, Python snippet and YAML snippet of README.md and docs/*.md runs or is checked by
its own parser: `cfmtrain` lines by the command's argument parser, `snakemake` lines planned as
written, `make` lines against the Makefile's targets, scripts run or syntax-checked."""

from __future__ import annotations

import argparse
import filecmp
import importlib
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
import torch
import yaml
from helpers import REPO

from cfmtrain import docs
from cfmtrain.bench.cli import BENCHMARKS
from cfmtrain.bench.loader import OURS
from cfmtrain.cli import COMMANDS
from cfmtrain.train.config import TrainConfig, load_config

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def blocks(kind: str, pages: list[Path] = PAGES) -> list[tuple[str, str]]:
    """(page name, text) of every ```<kind> block of the pages."""
    return [(page.name, text) for page in pages
            for text in re.findall(rf"```{kind}\n(.*?)```", page.read_text(), re.S)]


def commands() -> list[str]:
    """Every line of the bash blocks (comments dropped) and every command of the results table
    and of docs/paper.md's table."""
    lines = [line.split(" #")[0].strip() for _, text in blocks("bash")
             for line in text.splitlines()]
    return sorted({line for line in lines if line} | {r.command for r in docs.RESULTS}
                  | {item[1] for item in docs.PAPER_ITEMS})


def command_id(command: str) -> str:
    return command[:80]


# ---------------------------------------------------------------- generated parts


def test_generated_parts_are_up_to_date(capsys):
    """README's results table, docs/benchmarks.md, docs/configuration.md and config/README.md
    are exactly what `cfmtrain docs` writes from the committed reference CSVs and the schema."""
    assert docs.main(["--check", "--root", str(REPO)]) == 0, capsys.readouterr().out


def test_readme_results_table_is_generated():
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- cfmtrain docs: results -->\n(.*?)\n<!-- cfmtrain docs: end -->",
                      text, re.S).group(1)
    assert block == docs.results_table(REPO)
    assert block.count("\n| ") - 1 == len(docs.RESULTS) <= 10  # one row per result, a header


def test_results_without_a_csv_say_how_to_measure_them(tmp_path):
    (tmp_path / "docs/results").mkdir(parents=True)
    table = docs.results_table(tmp_path)
    for result in docs.RESULTS:
        assert (f"| not in the reference set: run the command | `{result.command}` | "
                f"`{result.source}`, not collected |") in table
    assert "No reference measurements yet." in table


def test_reference_csvs_are_small_and_named_by_the_table():
    folder = REPO / docs.REFERENCE
    known = {r.csv for r in docs.COLLECTED} | {docs.MANIFEST.name}
    files = {p.name for p in folder.iterdir()}
    assert files <= known, files - known
    assert all((folder / f).stat().st_size < 64_000 for f in files)
    manifest = pd.read_csv(REPO / docs.MANIFEST, dtype=str)
    assert sorted(manifest.file) == sorted(files - {docs.MANIFEST.name})
    assert manifest.file.is_unique and not manifest.isna().any().any()


def test_collect_replaces_and_stamps(tmp_path):
    """--collect copies what results/ holds, one CSV per benchmark, replacing the previous one
    and its manifest row (never appending), with the commit, date and host check."""
    root = tmp_path / "repo"
    (root / "docs/results").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], cwd=root, check=True,
                   env={**os.environ, "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z"})
    bench = root / "results/bench"
    bench.mkdir(parents=True)
    host = pd.DataFrame({"probe": [0, 1], "wall_s": [1.0, 1.02], "cpu_s": [1.0, 1.0],
                         "matmul_s": [0.5, 0.5], "gather_s": [0.5, 0.5]})
    host.to_csv(bench / "host.csv", index=False)
    for graphs in (10, 20):
        pd.DataFrame({"graphs": [graphs]}).to_csv(bench / "balance_full.csv", index=False)
        assert docs.collect(root, root / "results", []) == ["balance_full.csv", "host.csv"]
    assert pd.read_csv(root / "docs/results/balance_full.csv").graphs.tolist() == [20]
    manifest = pd.read_csv(root / docs.MANIFEST, dtype=str)
    assert sorted(manifest.file) == ["balance_full.csv", "host.csv"]
    assert set(manifest.host) == {"steady (probe spread 2%)"}
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()
    assert set(manifest.commit) == {head}  # the commit checked out when each file was written
    assert docs.collect(root, root / "results", ["nothing_of_that_name"]) == []


def test_loader_row_reads_the_benchmarks_own_label():
    assert docs.LOADER == OURS


def schema_keys(node: dict, prefix: str = "") -> list[str]:
    """Every key of the schema, written as the reference writes it."""
    keys = []
    for name, child in node.get("properties", {}).items():
        keys.append(prefix + name)
        if isinstance(child.get("additionalProperties"), dict):
            keys += schema_keys(child["additionalProperties"], f"{prefix}{name}.<name>.")
        if isinstance(child.get("items"), dict):
            keys += schema_keys(child["items"], f"{prefix}{name}[].")
        keys += schema_keys(child, f"{prefix}{name}.")
    return keys


def training_keys(cls: type = TrainConfig, prefix: str = "") -> list[str]:
    keys = []
    for name, value in vars(cls()).items():
        keys += (training_keys(type(value), f"{prefix}{name}.")
                 if hasattr(value, "__dataclass_fields__") else [prefix + name])
    return keys


@pytest.mark.parametrize("reference", ["docs/configuration.md"])
def test_every_schema_and_training_key_is_in_the_reference(reference):
    text = (REPO / reference).read_text()
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    keys = schema_keys(schema) + training_keys()
    assert len(keys) > 100
    missing = [key for key in keys if f"| `{key}` |" not in text]
    assert missing == []


# ---------------------------------------------------------------- the README's shape


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub and mkdocs make it."""
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


def test_readme_is_short_and_its_first_screen_finds_every_common_task():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    first_screen = "\n".join(lines[:30])
    for anchor in ("your-own-data", "on-a-slurm-cluster", "re-running-one-ablation-target",
                   "figures-and-the-report", "benchmarks"):
        assert f"(#{anchor})" in first_screen
        assert any(line.startswith("### ") and slug(line[4:]) == anchor for line in lines)


def test_readme_layout_lists_the_rooms_in_the_contracts_order():
    contract = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = contract["contracts"][0]["layers"]
    rooms = [room.strip() for layer in layers if layer != "__main__"
             for room in re.split(r"[|:]", layer)]
    text = (REPO / "README.md").read_text()
    layout = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    positions = [layout.find(f"`{room}`") for room in rooms]
    assert -1 not in positions, [r for r, p in zip(rooms, positions, strict=True) if p < 0]
    assert positions == sorted(positions)


def test_no_run_logs_in_the_documentation():
    """No session labels or issue numbers where users read (the check of the docs issue)."""
    pattern = re.compile(r"session|issue #|#1[0-9]\b", re.I)
    files = [*PAGES, *(REPO / "config").glob("*.yaml"), REPO / "config/README.md",
             *(REPO / "src").rglob("*.py")]
    hits = [f"{path.relative_to(REPO)}:{n}: {line.strip()}" for path in files
            for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_license_and_citation():
    assert (REPO / "LICENSE").read_text().startswith("MIT License")
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "MIT"
    paper = citation["preferred-citation"]
    assert paper["year"] == 2025 and paper["authors"][0]["family-names"] == "Firoz"
    assert "2504.10700" in paper["url"]


def test_bench_help_lists_every_benchmark():
    result = subprocess.run([sys.executable, "-m", "cfmtrain", "bench", "--help"],
                            capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    page = (REPO / "docs/benchmarks.md").read_text()
    for name in BENCHMARKS:
        assert name in result.stdout and f"| `{name}` |" in page, name


# ---------------------------------------------------------------- commands


def parse_cfmtrain(words: list[str]) -> argparse.Namespace:
    """A `cfmtrain ...` line read by its command's own parser (errors raise)."""
    modules = {name: module for name, (module, _, _) in COMMANDS.items()} | {
        "docs": "cfmtrain.docs"}
    name, rest = words[1], words[2:]
    if name == "bench":
        name, rest, module = f"bench {rest[0]}", rest[1:], BENCHMARKS[rest[0]]
    else:
        module = modules[name]
    parser = argparse.ArgumentParser(prog=f"cfmtrain {name}", exit_on_error=False)
    importlib.import_module(module).add_arguments(parser)
    return parser.parse_args(rest)


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (REPO / "Makefile").read_text(), re.M))


def make_variables() -> set[str]:
    """The variables the Makefile lets a caller set (`NAME ?= default`)."""
    return set(re.findall(r"^([A-Z_]+) \?=", (REPO / "Makefile").read_text(), re.M))


def without_env(words: list[str]) -> tuple[dict, list[str]]:
    """`A=1 B=2 cmd ...` -> ({A: 1, B: 2}, [cmd, ...])."""
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


SNAKEMAKE = [c for c in commands() if c.startswith("snakemake ")]
OTHERS = [c for c in commands() if not c.startswith("snakemake ")]


@pytest.mark.parametrize("command", OTHERS, ids=command_id)
def test_command_is_known_and_parses(command):
    env, words = without_env(shlex.split(command))
    assert set(env) <= {"CFMTRAIN_SKIP_SLURM", "CFMTRAIN_CPU_ARCH", "CFMTRAIN_TORCH"}, env
    if words[0] == "make":
        targets = [w for w in words[1:] if "=" not in w]  # `make target VAR=value ...`
        settings = {w.split("=")[0] for w in words[1:] if "=" in w}
        assert targets and set(targets) <= make_targets(), targets
        assert settings <= make_variables(), settings
    elif words[0] == "cfmtrain":
        args = parse_cfmtrain(words)
        given = getattr(args, "graphs", None)  # stores (paths), or counts (int) to generate
        stores = [g for g in (given if isinstance(given, list) else [given])
                  if g is not None and not isinstance(g, int)]
        assert all(str(g).startswith("results/graphs/") for g in stores), stores
    elif words[:3] == ["python", "-m", "pytest"]:
        files = [w for w in words[3:] if not w.startswith("-")]
        assert files and all((REPO / f).is_file() for f in files), files
    elif words[0] == "bash":
        assert (REPO / words[1]).is_file()
        assert subprocess.run(["bash", "-n", REPO / words[1]]).returncode == 0
    elif words == ["source", ".venv/bin/activate"]:  # the virtualenv scripts/setup.sh makes
        assert "-m venv .venv" in (REPO / "scripts/setup.sh").read_text()
    elif words[0] == "source":  # the environment file the local Slurm cluster writes
        assert words[1] == ".slurm/env.sh"
        start = (REPO / "scripts/slurm/start.sh").read_text()
        assert '"${CFM_SLURM_DIR:-.slurm}"' in start and '> "$state/env.sh"' in start
    elif words[:2] == ["python", "examples/make_own_data.py"]:
        pass  # run by test_example_data_is_what_its_script_writes
    elif words[:2] == ["python", "examples/balance_dataloader.py"]:
        pass  # run as written by test_balance_example_runs
    elif words[:2] == ["python", "examples/md_nvt.py"] or words[0] == "mace_create_lammps_model":
        pass  # run as written by tests/workflow/test_tutorial.py
    elif words == ["mkdocs", "build", "--strict"]:
        pass  # run by test_site_builds_strict
    else:
        pytest.fail(f"a command of no known kind: {command}")


@pytest.mark.workflow
@pytest.mark.parametrize("command", SNAKEMAKE, ids=command_id)
def test_snakemake_command_plans(command):
    """A dry run of the line as written (a report needs built figures: planned without it)."""
    words = shlex.split(command)[1:]
    if "--report" in words:
        at = words.index("--report")
        del words[at:at + 2]
    if "-n" not in words:
        words.append("-n")
    if {"config/own.yaml", "config/real_dft.yaml"} & set(words):
        pytest.skip("the real DFT data (../shared): planned by tests/workflow/test_own_files.py")
    if "examples/fine_tune.yaml" in words:
        pytest.skip("needs the foundation's model: planned by tests/workflow/test_tutorial.py")
    result = subprocess.run([sys.executable, "-m", "snakemake", *words], cwd=REPO, env=ENV,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_docs_cli_runs_as_shown(capsys):
    assert docs.main(["--check", "--root", str(REPO)]) == 0
    assert "up to date" in capsys.readouterr().out


# ---------------------------------------------------------------- snippets


def test_example_data_is_what_its_script_writes(tmp_path):
    result = subprocess.run([sys.executable, "examples/make_own_data.py", "--output", tmp_path],
                            cwd=REPO, capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    for name in ("cuni_emt.xyz", "isolated_atoms.xyz"):
        assert filecmp.cmp(tmp_path / name, REPO / "examples/own_data" / name, shallow=False)


@pytest.mark.slow
def test_balance_example_runs():
    lines = [c for c in commands() if c.startswith("python examples/balance_dataloader.py")]
    assert lines
    for line in lines:
        result = subprocess.run(shlex.split(line), cwd=REPO, capture_output=True, text=True,
                                timeout=600, env=ENV)
        assert result.returncode == 0, result.stderr[-3000:]


def test_own_data_snippet_is_the_example_config():
    texts = [text for page, text in blocks("yaml") if "examples/own_data/" in text]
    assert texts == [(REPO / "examples/own_data.yaml").read_text()]


@pytest.mark.workflow
def test_own_data_example_builds_its_graphs(tmp_path):
    """The own-data page's commands on the shipped files, in a stand-in for a fresh clone: the
    graphs really built (labels under custom keys, isolated atoms as E0s), the cell planned."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("Snakefile", "workflow", "profiles", "config", "examples"):
        (repo / name).symlink_to(REPO / name)
    lines = [c for c in SNAKEMAKE if "examples/own_data.yaml" in c
             and " model " not in c]  # the model target's: tests/workflow/test_tutorial.py
    assert len(lines) == 2
    for line, extra in zip(lines, (["--cores", "2"], ["-n"]), strict=True):
        result = subprocess.run([sys.executable, "-m", "snakemake", *shlex.split(line)[1:],
                                 *extra], cwd=repo, env=ENV, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    e0s = yaml.safe_load((repo / "results/data/cuni/frames/e0s.json").read_text())
    assert set(e0s) == {"Cu", "Ni"}
    shards = sorted((repo / "results/graphs/cuni").glob("shard_*.h5"))
    assert shards and (repo / "results/graphs/cuni/split.npz").is_file()


def yaml_kind(data: dict) -> str:
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    profiles = [yaml.safe_load(p.read_text()) for p in (REPO / "profiles").glob("*/config.yaml")]
    if set(data) <= set(schema["properties"]):
        return "config"
    if set(data) <= set(vars(TrainConfig())):
        return "training"
    if set(data) <= set().union(*profiles):
        return "profile"
    return "unknown"


@pytest.mark.parametrize("page,text", blocks("yaml"), ids=lambda v: str(v)[:40])
def test_yaml_snippet_is_valid(page, text, tmp_path):
    data = yaml.safe_load(text)
    kind = yaml_kind(data)
    if kind == "config":
        schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
        jsonschema.validate(data, schema)
        settings = data.get("train", {}).get("settings")
        if settings:
            (tmp_path / "settings.yaml").write_text(yaml.safe_dump(settings))
            load_config(tmp_path / "settings.yaml")
    elif kind == "training":
        (tmp_path / "train.yaml").write_text(text)
        load_config(tmp_path / "train.yaml")
    else:
        assert kind == "profile", f"{page}: a YAML snippet of no known kind: {text}"


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A folder holding `my.model`: a small mace-torch MACE (Cu, Ni; float64), as snippets load."""
    from helpers import small_model

    folder = tmp_path_factory.mktemp("snippets")
    torch.save(small_model(), folder / "my.model")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("page,code", blocks("python"), ids=lambda v: str(v)[:40])
def test_python_snippet_runs(page, code, model_folder):
    result = subprocess.run([sys.executable, "-c", code], cwd=model_folder, env=ENV,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{page}:\n{code}\n{result.stderr[-3000:]}"


def test_every_page_is_in_the_site():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed = {next(iter(entry.values())) for entry in config["nav"]}
    assert listed == {p.name for p in (REPO / "docs").glob("*.md")}


@pytest.mark.slow
def test_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                             tmp_path / "site"], cwd=REPO, capture_output=True, text=True,
                            timeout=600, env=ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
