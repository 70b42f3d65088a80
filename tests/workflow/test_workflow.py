"""`all` plans every stage's rules and every target plans the jobs its config implies (dry run)
for both configs (that the workflow lints clean and every target plans at all is checked once
by scripts/check_workflow.sh, a step of `make test`); the schema describes every key and refuses
unknown ones at any depth; data-set names are constrained and every config value reaches a
command line quoted and exact."""

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO

from cfmtrain import settings
from cfmtrain.config_sections import with_defaults
from cfmtrain.paper import ABLATION
from cfmtrain.plots import cli
from cfmtrain.sweep import cli as sweep_cli
from cfmtrain.sweep.settings import SweepSettings
from cfmtrain.train import cli as train_cli
from cfmtrain.train.config import load_config

TARGETS = ["all", "graphs", "stats", "balance", "benchmark", "ablation", "sweeps", "simulate",
           "figures", "accuracy", "md"]


def snakemake(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


# what `all` runs: every stage (frames to figures); `download` only for downloaded sets and
# the ~8-minute baseline check only in `ablation`
ALL_RULES = {"frames", "graph_shard", "split", "stats_dataset", "balance_report", "bench_balance",
             "bench_graphs", "bench_kernels", "bench_loader", "train_group", "sweep_batch",
             "sweep_capacity", "sweep_calibrate",
             "simulate_scaling", "all"} | set(cli.FIGURES)  # a rule per figure, of its name


def job_counts(output: str) -> dict[str, int]:
    """The dry run's "Job stats" table as {rule: jobs}."""
    lines = output[output.index("Job stats:"):].splitlines()[3:]
    counts = {}
    for line in lines[:lines.index(next(x for x in lines if x.startswith("total")))]:
        rule, count = line.split()
        counts[rule] = int(count)
    return counts


def expected_counts(config_file: str) -> dict[str, int]:
    """Jobs per rule that the config implies, counted here from the config itself."""
    config = yaml.safe_load((REPO / config_file).read_text())
    datasets = config["datasets"]
    members = {m for d in config["targets"]
               for m in datasets[d].get("members", [d])}
    matrix = config["train"]["matrix"]
    groups = {(d, r) for b in matrix for d in b["datasets"] for r in b["ranks"]}
    cells = {(d, v, r) for b in matrix for d in b["datasets"] for v in b["variants"]
             for r in b["ranks"] if v not in ABLATION}  # the others: single cells
    return {"graph_shard": sum(datasets[m]["shards"] for m in members),
            "frames": len(members), "stats_dataset": len(config["targets"]),
            "download": sum(datasets[m]["kind"] == "download" for m in members),
            "train_group": len(groups), "train_cell": len(cells)}


@pytest.mark.workflow
@pytest.mark.parametrize("config", ["config/config.yaml", "config/paper.yaml"])
def test_dry_run_all_schedules_every_stage(config):
    # --forceall: plan every job even where an earlier run left results in the work tree
    result = snakemake("-n", "--forceall", "--printshellcmds", "--cores", "2", "all",
                       "--configfile", config)
    assert result.returncode == 0, result.stdout + result.stderr
    counts = job_counts(result.stdout)
    for rule, jobs in expected_counts(config).items():
        assert counts.get(rule, 0) == jobs, (rule, counts)
    assert set(counts) - {"download", "train_cell"} == ALL_RULES, counts
    generate = [line for line in result.stdout.splitlines() if "cfmtrain generate" in line]
    if "generated" in (REPO / config).read_text():  # the frames rule's 2 threads are used
        assert generate and all("--workers 2" in line for line in generate), generate


@pytest.mark.workflow
@pytest.mark.parametrize("config", ["config/config.yaml", "config/paper.yaml"])
def test_dry_run_every_other_target(config):
    others = [t for t in TARGETS if t != "all"]
    result = snakemake("-n", "--forceall", *others, "--configfile", config)
    assert result.returncode == 0, result.stdout + result.stderr
    counts = job_counts(result.stdout)
    checks = len(yaml.safe_load((REPO / config).read_text())["train"].get("baseline_check", []))
    assert counts.get("baseline_check", 0) == checks
    assert counts["bench_accuracy"] == len(yaml.safe_load(
        (REPO / "config/config.yaml").read_text())["accuracy"]["datasets"])
    assert counts["bench_md"] == 1  # the goals preset
    assert set(counts) - {"download", "baseline_check", "bench_accuracy", "bench_md",
                          "train_cell"} == ALL_RULES - {"all"} | set(others)


@pytest.mark.workflow
def test_each_matrix_group_is_one_job_of_paired_rounds_and_a_cell_runs_alone():
    """`all` trains each (data set, ranks) group of the matrix in one `cfmtrain rounds` job of
    the four variants, its epochs config `train.rounds` + 1; a variant outside the four
    (`matched`) and a single cell asked for alone are `cfmtrain cell` jobs, with no group."""
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())["train"]
    matched = "results/train/mini_s/matched/r2/summary.json"
    result = snakemake("-n", "--forceall", "--printshellcmds", "--cores", "2", "all", matched)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "priority:" not in result.stdout
    groups, cells = {}, []
    for line in result.stdout.splitlines():
        if "cfmtrain launch" in line and " -- rounds " in line:
            argv = shlex.split(line[line.index("python -m cfmtrain"):])
            argv = argv[:argv.index(">")]
            output = argv[argv.index("--output") + 1]
            variants = argv[argv.index("--variants") + 1:argv.index("--dataset")]
            epochs = [w for w in argv if w.startswith("epochs=")]
            groups[output] = (argv[argv.index("--ranks") + 1], variants, epochs[-1])
        elif "python -m cfmtrain cell" in line:
            cells.append(line)
    expected = {f"results/train/{d}/r{r}": (str(r), list(ABLATION),
                                             f"epochs={config['rounds'] + 1}")
                for b in config["matrix"] for d in b["datasets"] for r in b["ranks"]}
    assert groups == expected
    assert len(cells) == 1 and "--output results/train/mini_s/matched/r2" in cells[0]
    alone = snakemake("-n", "--forceall", "results/train/mini_s/both/r1/summary.json")
    assert alone.returncode == 0, alone.stdout + alone.stderr
    counts = job_counts(alone.stdout)
    assert counts["train_cell"] == 1 and "train_group" not in counts


def _bad_config(tmp_path: Path, edit) -> Path:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    edit(config)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    return bad


@pytest.mark.workflow
@pytest.mark.parametrize("key, edit, message", [
    ("cutof", lambda c: c.update(cutof=5.0), "'cutof' was unexpected"),
    # nested: inside `train`
    ("epochz", lambda c: c["train"].update(epochz=3), "'epochz' was unexpected"),
    # inside `datasets.<name>`
    ("sead", lambda c: c["datasets"]["mini"].update(sead=1), "'sead' was unexpected"),
    # inside `train.settings` (config.py's keys, checked by the training loader)
    ("valid_graphs_per_bach", lambda c: c["train"]["settings"].update(
        batch={"valid_graphs_per_bach": 4}),
     "config train.settings: config: unknown key 'batch.valid_graphs_per_bach'"),
])
def test_unknown_config_key_is_refused(tmp_path, key, edit, message):
    result = snakemake("-n", "--configfile", str(_bad_config(tmp_path, edit)))
    assert result.returncode != 0
    assert message in result.stdout + result.stderr


@pytest.mark.workflow
def test_manual_set_without_path_is_refused(tmp_path):
    def edit(config):
        config["datasets"]["cuni"] = {"kind": "manual"}
        config["targets"] = ["cuni"]

    result = snakemake("-n", "--configfile", str(_bad_config(tmp_path, edit)))
    assert result.returncode != 0
    assert "'path' is a required property" in result.stdout + result.stderr


@pytest.mark.workflow
def test_settings_and_split_out_of_range_are_refused_by_the_dry_run(tmp_path):
    def zero_batch(config):
        config["train"]["settings"]["batch"] = {"valid_graphs_per_batch": 0}

    def whole_split(config):
        config["split"].update(valid=0.5, test=0.5)

    result = snakemake("-n", "--configfile", str(_bad_config(tmp_path, zero_batch)))
    assert result.returncode != 0
    assert "config batch.valid_graphs_per_batch: 0 must be >= 1" in result.stdout + result.stderr
    result = snakemake("-n", "--configfile", str(_bad_config(tmp_path, whole_split)))
    assert result.returncode != 0
    assert "valid (0.5) + test (0.5) must be < 1" in result.stdout + result.stderr


@pytest.mark.workflow
@pytest.mark.parametrize("name", ["x;touch /tmp/cfmtrain-pwned;y", "../outside", "a..b"])
def test_a_data_set_name_that_is_not_a_plain_word_is_refused(tmp_path, name):
    def edit(config):
        config["datasets"][name] = {"kind": "generated", "scale": 0.1}
        config["targets"] = [name]

    result = snakemake("-n", "graphs", "--configfile", str(_bad_config(tmp_path, edit)))
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{name!r} does not match" in output and "A data-set name - letters" in output


# text with a shell's special characters, each of which must reach its command as one word
ODD_PATH = "/data/my frames;touch it/Bob's.xyz"
ODD_MODEL = "/models/$(hostname) 1.model"
# numbers as a user writes them; PyYAML (YAML 1.1, as Snakemake reads configs) leaves them text
SMALL_FLOATS = "train:\n  settings:\n    optim: {lr: 1e-4, weight_decay: 5e-07, gamma: 1.0e-1}\n"


@pytest.mark.workflow
def test_config_values_reach_each_command_line_exactly(tmp_path):
    def edit(config):
        config["datasets"]["odd"] = {"kind": "manual", "path": ODD_PATH, "registry": "mptrj",
                                     "energy_key": "total energy", "shards": 1}
        config["sweep"] = {"small_subset": "water clusters;x"}
        config["train"]["settings"]["model"]["init_model"] = ODD_MODEL

    overlay = tmp_path / "floats.yaml"
    overlay.write_text(SMALL_FLOATS)
    targets = ["results/data/odd/frames", "results/sweep/mini/batch_quick.csv",
               "results/train/mini_s/baseline/r1/summary.json"]
    result = snakemake("-n", "--forceall", "--printshellcmds", "--cores", "2", *targets,
                       "--configfile", str(_bad_config(tmp_path, edit)), str(overlay))
    assert result.returncode == 0, result.stdout + result.stderr
    commands = {}
    for line in result.stdout.splitlines():
        if "python -m cfmtrain" in line:
            argv = shlex.split(line[line.index("python -m cfmtrain"):])
            commands[argv[3]] = argv[:argv.index(">")]
    convert, sweep, cell = commands["convert"], commands["sweep"], commands["cell"]
    assert convert[convert.index("--input") + 1] == ODD_PATH
    assert convert[convert.index("--energy-key") + 1] == "total energy"
    sweep_parser = argparse.ArgumentParser()
    sweep_cli.add_arguments(sweep_parser)  # the sweep's own command line, read as `cfmtrain sweep`
    assert settings.from_args(SweepSettings, sweep_parser.parse_args(
        sweep[sweep.index("batch"):])).small_subset == "water clusters;x"
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)  # the cell's own command line, read as `cfmtrain train`
    args = parser.parse_args(cell[cell.index("train") + 1:])
    cfg = load_config(args.config, args.overrides)
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.gamma) == (1e-4, 5e-7, 0.1)
    default = yaml.safe_load((REPO / "config/config.yaml").read_text())["train"]
    assert (cfg.model.init_model, cfg.model.hidden_irreps, cfg.train_fraction,
            cfg.eval_fraction) == (ODD_MODEL, default["settings"]["model"]["hidden_irreps"],
                                   default["sizes"]["s"], default["settings"]["eval_fraction"])


def _schema_keys(node: dict, path: str = ""):
    """(dotted path, schema, required by its parent) of every key the schema defines."""
    required = set(node.get("required", []))
    for branch in node.get("allOf", []):
        required |= set(branch.get("then", {}).get("required", []))  # conditionally required
    for key, sub in node.get("properties", {}).items():
        yield f"{path}{key}", sub, key in required
        yield from _schema_keys(sub, f"{path}{key}.")
    if isinstance(node.get("additionalProperties"), dict):  # datasets.<name>.kind
        yield from _schema_keys(node["additionalProperties"], f"{path}<name>.")
    if isinstance(node.get("items"), dict):  # train.matrix[].ranks
        yield from _schema_keys(node["items"], f"{path.rstrip('.')}[].")


def test_every_schema_key_has_a_description_and_a_default():
    """Every key: its own default, or that of its command's settings (config_sections)."""
    schema = with_defaults(yaml.safe_load(
        (REPO / "workflow/schemas/config.schema.yaml").read_text()))
    keys = list(_schema_keys(schema))
    assert len(keys) > 60 and "figures.sizes[].ranks" in [k for k, _, _ in keys]
    for key, sub, required in keys:
        assert sub.get("description"), f"{key}: no description"
        text = " ".join(sub["description"].split())
        if "default" in sub:
            continue
        # no schema default: a required key, or one whose default depends on other keys
        if required:
            assert text.startswith("Required"), f"{key}: say that it is required"
        else:
            assert "Default - " in text, f"{key}: no default and none described"


@pytest.mark.workflow
def test_local_profile_runs_every_timed_job_alone():
    """Under profiles/local each job of `all` that times something (benchmarks, sweeps, training
    cells) takes the profile's whole `machine` limit, so Snakemake starts nothing beside it,
    while every other job takes a share that lets untimed jobs run side by side."""
    import re

    profile = yaml.safe_load((REPO / "profiles/local/config.yaml").read_text())
    limit = dict(r.split("=") for r in profile["resources"])["machine"]
    default = dict(r.split("=") for r in profile["default-resources"])["machine"]
    result = snakemake("-n", "--forceall", "--profile", "profiles/local", "all")
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = re.findall(r"^(?:local)?rule (\w+):\n(.*?)(?=^\S|\Z)", result.stdout, re.M | re.S)
    machine = {}
    for rule, body in jobs:
        machine.setdefault(rule, set()).add(int(re.search(r"machine=(\d+)", body)[1]))
    timed = {"bench_graphs", "bench_balance", "bench_kernels", "bench_loader", "train_group",
             "sweep_batch", "sweep_capacity", "sweep_calibrate"}
    assert timed <= set(machine), machine
    for rule, values in machine.items():
        assert values == ({int(limit)} if rule in timed else {int(default)}), (rule, values)
    assert 2 * int(default) <= int(limit)  # two untimed jobs fit beside each other


def test_slurm_profiles_give_resources_to_every_timed_or_long_rule():
    """Both Slurm profiles set resources for the same rules, all of them real rules, and for
    every rule that times something (a benchmark or training: default resources would give
    it 60 minutes and 2 GB)."""
    import re

    text = "\n".join(p.read_text() for p in [REPO / "Snakefile",
                                             *sorted((REPO / "workflow/rules").glob("*.smk"))])
    blocks = {m.group(1): m.group(2) for m in re.finditer(
        r"^rule (\w+):\n(.*?)(?=^\S|\Z)", text, re.M | re.S)}
    timed = {name for name, body in blocks.items() if "machine=ALONE" in body}
    assert {"bench_md", "bench_accuracy", "train_cell", "train_group"} <= timed
    named = [set(yaml.safe_load((REPO / f"profiles/{p}/config.yaml").read_text())
                 ["set-resources"]) for p in ("slurm", "slurm-gpu")]
    assert named[0] == named[1]
    assert timed <= named[0] <= set(blocks), (timed - named[0], named[0] - set(blocks))
