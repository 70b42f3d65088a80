# Helpers shared by the rules: config validation, wildcard constraints, input functions.
import re

from snakemake.utils import validate


validate(config, schema="../schemas/config.schema.yaml")

DATASETS = config["datasets"]
PY = "python -m cfmtrain"  # used by input functions that build commands

for _name in config["targets"]:
    if _name not in DATASETS:
        raise ValueError(f"config targets: unknown data set {_name!r}; known: {list(DATASETS)}")


wildcard_constraints:
    dataset="|".join(map(re.escape, DATASETS)) or "NONE",
    shard=r"\d{4}",
    preset="quick|full",


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
    """The --graphs argument: one store folder, or the member folders of a union."""
    return " ".join(f"results/graphs/{m}" for m in member_datasets(wildcards.dataset))


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
        return (f"python -m cfmtrain generate --output-dir {output} --num-shards {shards} "
                f"--scale {cfg['scale']} --seed {cfg['seed']} --workers {threads}")
    source = (f"results/downloads/{wildcards.dataset}" if cfg["kind"] == "download"
              else cfg["path"])
    command = (f"{PY} convert {cfg.get('registry', wildcards.dataset)} --input {source} "
               f"--output {output} --shards {shards} --no-progress")
    if "energy_key" in cfg:
        command += f" --energy-key {cfg['energy_key']}"
    return command + (" --skip-invalid" if config["skip_invalid"] else "")


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
