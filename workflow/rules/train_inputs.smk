# Input functions of train.smk (kept apart from the rules, as `snakemake --lint` asks).
# <trainset> is a data set of config `datasets`, optionally with a size suffix of config
# `train.sizes` (mini_s, mini_m: a nested quarter and half of mini's training split).
import json
import os

TRAIN = config["train"]


def train_base(trainset):
    """(data set, training fraction) of a trainset name such as mini_s."""
    if trainset in DATASETS:
        return trainset, 1.0
    base, _, suffix = trainset.rpartition("_")
    if base in DATASETS and suffix in TRAIN["sizes"]:
        return base, float(TRAIN["sizes"][suffix])
    raise ValueError(f"{trainset!r} is neither a data set of config `datasets` nor one with a "
                     f"size suffix of config `train.sizes` ({sorted(TRAIN['sizes'])})")


def train_shards(wildcards):
    base = train_base(wildcards.trainset)[0]
    return [
        f"results/graphs/{member}/shard_{shard}.h5"
        for member in member_datasets(base)
        for shard in shard_ids(member)
    ]


def train_graphs(wildcards):
    """The --graphs arguments (`{params.graphs:q}`) of a trainset."""
    base = train_base(wildcards.trainset)[0]
    return [f"results/graphs/{m}" for m in member_datasets(base)]


def train_split(wildcards):
    return f"results/graphs/{train_base(wildcards.trainset)[0]}/split.npz"


def settings_files(wildcards):
    """The files config `train.settings` names (model.e0s, model.e0s_fixed): inputs of every
    rule that passes the settings, so that an edited one retrains."""
    model = TRAIN["settings"].get("model", {})
    e0s, fixed = model.get("e0s"), model.get("e0s_fixed")
    files = [e0s] if isinstance(e0s, str) and e0s not in ("fit", "average") else []
    return files + (list(fixed) if isinstance(fixed, list) else [])


def _flat(settings, prefix=""):
    for key, value in settings.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def data_e0s(dataset):
    """Training config settings (dotted key -> value) for the data set's E0s (files sets): none
    for fit (train.settings decides), average, the e0s.json its frames step wrote, or for a
    union whose members give some: those members' elements held fixed, the others fitted."""
    members = member_datasets(dataset)
    given = {m: DATASETS[m].get("e0s", "fit") for m in members}
    if all(e0s == "fit" for e0s in given.values()):
        return {}
    if all(e0s == "average" for e0s in given.values()):
        return {"model.e0s": "average"}
    files = [f"results/data/{m}/frames/e0s.json" for m, e0s in given.items()
             if e0s not in ("fit", "average")]
    if len(members) == 1:
        return {"model.e0s": files[0]}
    if "average" in given.values():
        raise ValueError(f"data set {dataset}: a member's e0s is average, another's given "
                         f"({given}); mace-torch's average cannot hold elements fixed: give "
                         "that member fit")
    return {"model.e0s": "fit", "model.e0s_fixed": files}


def train_settings(wildcards):
    """`--set KEY=VALUE` options from config `train.settings` plus the size's fraction and the
    data set's E0s, shell quoted; values as JSON (5e-07, "8x0e", [16, 16], true), which cfmtrain
    reads by key type."""
    pairs = dict(_flat(TRAIN["settings"]))
    pairs["train_fraction"] = train_base(wildcards.trainset)[1]
    pairs.update(data_e0s(train_base(wildcards.trainset)[0]))
    return set_options(pairs)


def set_options(pairs):
    """`--set KEY=VALUE` words of dotted keys -> values, shell quoted."""
    return command(*(word for k, v in pairs.items()
                     for word in ("--set", f"{k}={json.dumps(v, ensure_ascii=False)}")))


def matrix_groups():
    """(data set, ranks) of every group of config `train.matrix`, in the matrix's order."""
    return list(dict.fromkeys((d, r) for block in TRAIN["matrix"] for d in block["datasets"]
                              for r in block["ranks"]))


def group_folder(dataset, ranks):
    return f"results/train/{dataset}/r{ranks}"


def cell_summary(dataset, variant, ranks):
    """The run of a variant the figures read: its group's for the paper's four variants
    (trained in paired rounds), else the cell's own."""
    if variant in ABLATION:
        return f"{group_folder(dataset, ranks)}/{variant}/summary.json"
    return f"results/train/{dataset}/{variant}/r{ranks}/summary.json"


def ablation_targets():
    """Every group of config `train.matrix` (its paired.csv: the four variants trained in
    paired rounds), then the cells of the other variants a block names (matched)."""
    groups = [f"{group_folder(d, r)}/paired.csv" for d, r in matrix_groups()]
    cells = [cell_summary(d, v, r) for block in TRAIN["matrix"] for d in block["datasets"]
             for r in block["ranks"] for v in block["variants"] if v not in ABLATION]
    return groups + list(dict.fromkeys(cells))


def baseline_check_targets():
    """The checks of config `train.baseline_check`: mace_run_train against the baseline."""
    return [f"results/train/{d}/baseline_check.json" for d in TRAIN["baseline_check"]]
