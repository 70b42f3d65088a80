# Time to accuracy (target `accuracy`, not in `all`): cfmtrain baseline and both
# against mace-torch's own mace_run_train on the same split, model, epochs, E0s and batches.
ACCURACY = config["accuracy"]
# the benchmark's summary per data set of config `accuracy.datasets`
ACCURACY_TARGETS = [
    f"results/bench/accuracy_{d}_{ACCURACY['preset']}_summary.csv"
    for d in ACCURACY["datasets"]
]


rule bench_accuracy:
    input:
        shards=graph_shards,
        split="results/graphs/{dataset}/split.npz",
    output:
        csv="results/bench/accuracy_{dataset}_{apreset}.csv",
        summary="results/bench/accuracy_{dataset}_{apreset}_summary.csv",
        rounds="results/bench/accuracy_{dataset}_{apreset}_rounds.csv",
        overall="results/bench/accuracy_{dataset}_{apreset}_overall.csv",
        json="results/bench/accuracy_{dataset}_{apreset}.json",
        png="results/figures/fig_accuracy_{dataset}_{apreset}.png",
        pdf="results/figures/fig_accuracy_{dataset}_{apreset}.pdf",
    log:
        "logs/bench/accuracy_{dataset}_{apreset}.log",
    wildcard_constraints:
        apreset="quick|medium|model|goals",
    params:
        graphs=graph_dirs,
        # config `accuracy`'s settings at the wildcard's preset and the job's threads, the data
        # set's E0s (given, fixed for a union's members that give them, or fitted), and with the
        # preset `model` the settings of config model.settings (the model target's)
        options=lambda wildcards, threads: " ".join(filter(None, [
            command(*settings_option(config, "accuracy", preset=wildcards.apreset,
                                     threads=threads)),
            set_options(data_e0s(wildcards.dataset)),
            command("--model-settings", json.dumps(config["model"]["settings"]))
            if wildcards.apreset == "model" else ""])),
    threads: workflow.cores
    resources:
        machine=ALONE,
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain bench accuracy --graphs {params.graphs:q} --split {input.split:q}"
        " --name {wildcards.dataset:q}_{wildcards.apreset:q} {params.options}"
        " --figure {output.png:q} > {log:q} 2>&1"
