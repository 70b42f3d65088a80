# Helpers shared by the rules: config validation, wildcard constraints, input functions.
# Every value put on a command line is shell-quoted - `{x:q}` in shell strings, `command()`
# for commands and options built in Python.
import glob
import json
import os
import re
import shlex
from pathlib import Path

import yaml
from snakemake.utils import validate

from cfmtrain.config_check import check_workflow_config
from cfmtrain.config_sections import fill as fill_settings
from cfmtrain.config_sections import option as settings_option
from cfmtrain.paper import ABLATION, BASELINE, BOTH, VARIANTS
from cfmtrain.train.config import ConfigError, typed_settings

SCHEMA = Path(workflow.basedir, "workflow/schemas/config.schema.yaml")
# a YAML 1.2 number that PyYAML (YAML 1.1, Snakemake's reader) may leave as text: 1e-4, 5e-07
NUMBER = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")


def yaml12_numbers(value, schema):
    """`value` with number text (1e-4, 5e-07) as floats wherever `schema` expects a number."""
    if isinstance(value, dict):
        extra = schema.get("additionalProperties")
        extra = extra if isinstance(extra, dict) else {}
        return {k: yaml12_numbers(v, schema.get("properties", {}).get(k, extra))
                for k, v in value.items()}
    if isinstance(value, list):
        return [yaml12_numbers(v, schema.get("items", {})) for v in value]
    types = schema.get("type", [])
    if isinstance(value, str) and "number" in ([types] if isinstance(types, str) else types):
        return float(value) if NUMBER.fullmatch(value.strip()) else value
    return value


config.update(yaml12_numbers(config, yaml.safe_load(SCHEMA.read_text())))
validate(config, schema=str(SCHEMA))
# The sections that are a command's settings (simulate, sweep, accuracy, scale, bench) get the
# keys left out from the command's dataclass (cfmtrain.config_sections): the schema holds no
# defaults of theirs. What a schema cannot say (finite numbers, the cutoff's range, seeds, files,
# the training settings), checked by the code that uses each value; the e3nn checks of the model
# settings (seconds) only in the main process, once per model setting (stamped under .snakemake/).
try:
    fill_settings(config)
    check_workflow_config(config, library_checks=workflow.is_main_process,
                          passed=Path(".snakemake/cfmtrain-checked"))
    config["train"]["settings"] = typed_settings(config["train"]["settings"])
except ConfigError as err:
    raise ValueError(str(err)) from None

DATASETS = config["datasets"]
# the `scale` target's data sets: the crystals preset at each count (docs/scale.md)
SCALE = config["scale"]
for _count in SCALE["graphs"]:
    if f"scale_{_count}" in DATASETS:
        raise ValueError(f"config datasets: scale_{_count} is the name of a `scale` target's "
                         "data set; rename it")
    DATASETS[f"scale_{_count}"] = {"kind": "generated", "preset": "crystals", "graphs": _count,
                                   "seed": 0, "shards": -(-_count // SCALE["shard_graphs"])}
# A timed job (benchmark, sweep, training cell) declares resources machine=ALONE: it holds the
# whole machine, against profiles/local's limit machine=100 where every other job takes 1
# (default-resources), so no job starts beside a timing and none times beside another. Under
# Slurm each job has its own allocation and no limit is set.
ALONE = 100

for _name in config["targets"]:
    if _name not in DATASETS:
        raise ValueError(f"config targets: unknown data set {_name!r}; known: {list(DATASETS)}")


wildcard_constraints:
    dataset="|".join(map(re.escape, DATASETS)) or "NONE",
    shard=r"\d{4}",
    preset="quick|full",


def command(*words):
    """Shell text of `words` (str() of each), every one quoted where the shell needs it."""
    return shlex.join(str(w) for w in words)


def dataset_config(wildcards):
    return DATASETS[wildcards.dataset]


def shard_ids(dataset):
    return [f"{k:04d}" for k in range(DATASETS[dataset]["shards"])]


def member_datasets(dataset):
    """The data sets whose graphs make up `dataset`: its members for a union, else itself."""
    cfg = DATASETS[dataset]
    if cfg["kind"] != "union":
        return [dataset]
    unknown = [m for m in cfg["members"] if DATASETS.get(m, {"kind": "union"})["kind"] == "union"]
    if unknown:
        raise ValueError(f"config datasets.{dataset}.members: {unknown} are not data sets with "
                         "graphs of their own")
    return cfg["members"]


def graph_shards(wildcards):
    return [
        f"results/graphs/{member}/shard_{shard}.h5"
        for member in member_datasets(wildcards.dataset)
        for shard in shard_ids(member)
    ]


def graph_dirs(wildcards):
    """The --graphs arguments (`{params.graphs:q}`): one store folder, or a union's members."""
    return [f"results/graphs/{m}" for m in member_datasets(wildcards.dataset)]


def own_files(dataset):
    """The files of a `kind: files` set: its `paths`, globs expanded (relative to the working
    directory, the clone's root), in order, each once. A pattern that matches nothing is refused
    by the config check before this is called; should its files go while Snakemake runs, it
    stays as written, for `cfmtrain convert` to name."""
    found = []
    for pattern in DATASETS[dataset]["paths"]:
        matches = glob.glob(os.path.expanduser(pattern), recursive=True)
        found.extend(sorted(p for p in matches if os.path.isfile(p)) or [pattern])
    by_file = {os.path.realpath(p): p for p in reversed(found)}  # a file under two spellings
    return [p for p in found if by_file[os.path.realpath(p)] == p]  # once, as first listed


def own_e0s_argument(e0s):
    """`--e0s` of `cfmtrain convert --own-data` for config `e0s` (a keyword or a mapping)."""
    if isinstance(e0s, str):
        return e0s
    return e0s["file"] if "file" in e0s else json.dumps(e0s)


def frames_inputs(wildcards):
    """What the frames step reads, so that a changed, added or removed file redoes it: the
    download of a downloaded set, the files of an own set (and its E0s file), a manual set's.
    So do an input whose content changed behind its modification time and frames made with
    other settings (rebuild.smk)."""
    cfg = dataset_config(wildcards)
    check_frames(wildcards.dataset, cfg)
    return read_inputs(cfg, wildcards.dataset)


def read_inputs(cfg, dataset):
    if cfg["kind"] == "download":
        return [f"results/downloads/{dataset}"]
    if cfg["kind"] == "files":
        e0s = cfg.get("e0s", "fit")
        e0s_file = [e0s["file"]] if isinstance(e0s, dict) and "file" in e0s else []
        return [f for f in [*own_files(dataset), *e0s_file] if os.path.isfile(f)]
    if cfg["kind"] == "manual":  # its files once present (convert names a missing path)
        path = cfg["path"]
        if os.path.isdir(path):
            return sorted(p for p in glob.glob(os.path.join(path, "**"), recursive=True)
                          if os.path.isfile(p))
        return [path] if os.path.isfile(path) else []
    return []


def frames_command(wildcards, output, threads):
    """The command that writes results/data/<dataset>/frames for the data set's kind."""
    cfg = dataset_config(wildcards)
    shards = cfg["shards"]
    if cfg["kind"] == "union":
        raise ValueError(f"data set {wildcards.dataset} is a union: it has no frames of its own")
    if cfg["kind"] == "files":
        keys = [f"{field}={name or ''}" for field, name in cfg.get("keys", {}).items()]
        return command("python", "-m", "cfmtrain", "convert", wildcards.dataset, "--own-data",
                       "--input", *own_files(wildcards.dataset), "--output", output[0],
                       "--shards", shards, "--no-progress", "--workers", threads,
                       *(word for pair in keys for word in ("--key", pair)),
                       "--e0s", own_e0s_argument(cfg.get("e0s", "fit")),
                       *(["--skip-invalid"] if config["skip_invalid"] else []))
    if cfg["kind"] == "generated":
        size = (["--graphs", cfg["graphs"]] if cfg["preset"] == "crystals"
                else ["--scale", cfg["scale"]])
        return command("python", "-m", "cfmtrain", "generate", "--preset", cfg["preset"],
                       "--output-dir", output[0], "--num-shards", shards, *size,
                       "--seed", cfg["seed"], "--workers", threads)
    source = (f"results/downloads/{wildcards.dataset}" if cfg["kind"] == "download"
              else cfg["path"])
    words = ["python", "-m", "cfmtrain", "convert", cfg.get("registry", wildcards.dataset),
             "--input", source, "--output", output[0], "--shards", shards, "--no-progress",
             "--workers", threads]
    if "energy_key" in cfg:
        words += ["--energy-key", cfg["energy_key"]]
    return command(*words, *(["--skip-invalid"] if config["skip_invalid"] else []))


def graph_targets():
    return [f"results/graphs/{d}/split.npz" for d in config["targets"]]


def stats_targets():
    return [
        f"results/stats/{d}/{name}"
        for d in config["targets"]
        for name in ("table3.csv", "table3.md")
    ] + [f"results/figures/fig05_sizes_{d}.png" for d in config["targets"]]


def balance_targets():
    return [
        f"results/balance/{d}/{name}"
        for d in config["targets"]
        for name in ("packing.csv", "packing.md")
    ] + [f"results/figures/fig12_graphs_per_rank_{d}.png" for d in config["targets"]]


def bench_targets():
    preset = config["bench"]["preset"]
    names = ("graphs", "balance", "kernels", "loader")
    return [f"results/bench/{name}_{preset}.csv" for name in names]
