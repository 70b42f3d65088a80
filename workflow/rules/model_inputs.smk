# Input functions of model.smk (kept apart from the rules, as `snakemake --lint` asks).
from cfmtrain.train import presets

MODEL = config["model"]
MODEL_SETS = MODEL["datasets"]


def model_config():
    """The training settings of a `model` run, nested: the model preset, fine-tuning's with
    config model.init_model, then config model.settings (cfmtrain.train.presets)."""
    return presets.model_settings(MODEL["settings"], fine_tune=MODEL["init_model"] is not None)


def model_settings(wildcards):
    """`--set KEY=VALUE` options of the data set's `model` run: its settings (model_config),
    the data set's E0s, the model to fine-tune and the replay ratio, shell quoted."""
    pairs = presets.flat(model_config())
    pairs.update(data_e0s(wildcards.mset))
    if MODEL["init_model"] is not None:
        pairs["model.init_model"] = MODEL["init_model"]
    if "replay_ratio" in MODEL:
        pairs["replay_ratio"] = MODEL["replay_ratio"]
    return set_options(pairs)


def model_files(wildcards):
    """What a `model` run reads besides its data set's graphs: the E0s files its settings
    name, the model it fine-tunes, the replay set's graphs and split."""
    model = model_config().get("model", {})
    e0s, fixed = model.get("e0s"), model.get("e0s_fixed")
    files = [e0s] if isinstance(e0s, str) and e0s not in ("fit", "average") else []
    files += list(fixed) if isinstance(fixed, list) else []
    if MODEL["init_model"] is not None:
        files.append(MODEL["init_model"])
    if MODEL["replay"] is not None:
        files += [f"results/graphs/{m}/shard_{s}.h5" for m in member_datasets(MODEL["replay"])
                  for s in shard_ids(m)]
        files.append(f"results/graphs/{MODEL['replay']}/split.npz")
    return files


def model_shards(wildcards):
    return [f"results/graphs/{m}/shard_{s}.h5" for m in member_datasets(wildcards.mset)
            for s in shard_ids(m)]


def model_graphs(wildcards):
    return [f"results/graphs/{m}" for m in member_datasets(wildcards.mset)]


def model_replay(wildcards):
    """--replay-graphs and --replay-split of config model.replay, shell quoted ("" without)."""
    replay = MODEL["replay"]
    if replay is None:
        return ""
    return command("--replay-graphs", *(f"results/graphs/{m}" for m in member_datasets(replay)),
                   "--replay-split", f"results/graphs/{replay}/split.npz")


def model_threads(ranks):
    """Threads of a `model` run: ranks x its settings' threads (0: the cores over the ranks)."""
    return ranks * (model_config().get("threads") or max(1, workflow.cores // ranks))


def model_targets():
    """The evaluation table, parity plot and learning curves of each data set of
    config model.datasets (and with them its trained models)."""
    return [f"results/model/{d}/{name}" for d in MODEL_SETS
            for name in ("evaluation.csv", "parity.png", "learning_curves.png")]
