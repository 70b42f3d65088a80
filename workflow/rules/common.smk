# Helpers shared by the rules: config validation, wildcard constraints, input functions.
# Every value put on a command line is shell-quoted - `{x:q}` in shell strings, `command()`
# for commands and options built in Python.
import re
import shlex
from pathlib import Path

import yaml
from snakemake.utils import validate

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

DATASETS = config["datasets"]

if config["split"]["valid"] + config["split"]["test"] >= 1:
    raise ValueError(f"config split: valid ({config['split']['valid']}) + test "
                     f"({config['split']['test']}) must be < 1, or no graph is left to train on")

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


def frames_inputs(wildcards):
    """A downloaded set needs its download first; others read from their own source."""
    if dataset_config(wildcards)["kind"] == "download":
        return f"results/downloads/{wildcards.dataset}"
    return []


def frames_command(wildcards, output, threads):
    """The command that writes results/data/<dataset>/frames for the data set's kind."""
    cfg = dataset_config(wildcards)
    shards = cfg["shards"]
    if cfg["kind"] == "union":
        raise ValueError(f"data set {wildcards.dataset} is a union: it has no frames of its own")
    if cfg["kind"] == "generated":
        return command("python", "-m", "cfmtrain", "generate", "--output-dir", output[0],
                       "--num-shards", shards, "--scale", cfg["scale"], "--seed", cfg["seed"],
                       "--workers", threads)
    source = (f"results/downloads/{wildcards.dataset}" if cfg["kind"] == "download"
              else cfg["path"])
    words = ["python", "-m", "cfmtrain", "convert", cfg.get("registry", wildcards.dataset),
             "--input", source, "--output", output[0], "--shards", shards, "--no-progress"]
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
    ] + [f"results/figures/fig05_{d}_sizes.png" for d in config["targets"]]


def balance_targets():
    return [
        f"results/balance/{d}/{name}"
        for d in config["targets"]
        for name in ("packing.csv", "packing.md")
    ] + [f"results/figures/fig12_{d}_graphs_per_rank.png" for d in config["targets"]]


def bench_targets():
    preset = config["bench"]["preset"]
    return [f"results/bench/{name}_{preset}.csv" for name in ("graphs", "balance", "kernels")]
