# Sweeps: time per step against batch size (Figure 11) and against bin capacity (section 5.5),
# on one data set's graphs; results/sweep/<dataset>/<kind>_<preset>.csv. Never ablation cells.


rule sweep_batch:
    input:
        shards=graph_shards,
        split="results/graphs/{dataset}/split.npz",
    output:
        "results/sweep/{dataset}/batch_{preset}.csv",
    log:
        "logs/sweep/{dataset}/batch_{preset}.log",
    benchmark:
        "benchmarks/sweep/{dataset}/batch_{preset}.tsv"
    params:
        graphs=graph_dirs,
        args=sweep_args,
    threads: 2
    resources:
        machine=ALONE,
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain sweep batch --graphs {params.graphs:q} --split {input.split:q}"
        " {params.args} --output {output:q} > {log:q} 2>&1"


rule sweep_capacity:
    input:
        shards=graph_shards,
        split="results/graphs/{dataset}/split.npz",
    output:
        csv="results/sweep/{dataset}/capacity_{preset}.csv",
        json="results/sweep/{dataset}/capacity_{preset}.json",
        md="results/sweep/{dataset}/capacity_{preset}.md",
    log:
        "logs/sweep/{dataset}/capacity_{preset}.log",
    benchmark:
        "benchmarks/sweep/{dataset}/capacity_{preset}.tsv"
    params:
        graphs=graph_dirs,
        args=sweep_args,
    threads: 2
    resources:
        machine=ALONE,
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain sweep capacity --graphs {params.graphs:q} --split {input.split:q}"
        " {params.args} --output {output.csv:q}"
        " --recommendation {output.json:q} > {log:q} 2>&1"


# The simulator's calibration: step time of the cells' own model (config train.settings) per
# compute path over batch sizes; results/sweep/<trainset>/calibration_<preset>.csv.
rule sweep_calibrate:
    input:
        shards=train_shards,
        split=train_split,
        settings_files=settings_files,
    output:
        "results/sweep/{trainset}/calibration_{preset}.csv",
    log:
        "logs/sweep/{trainset}/calibration_{preset}.log",
    benchmark:
        "benchmarks/sweep/{trainset}/calibration_{preset}.tsv"
    wildcard_constraints:
        trainset=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    params:
        graphs=train_graphs,
        settings=train_settings,
    # one rank's threads (the cells' train.settings.threads), timed alone like a cell
    threads: TRAIN["settings"].get("threads") or workflow.cores
    resources:
        machine=ALONE,
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain sweep calibrate --graphs {params.graphs:q} --split {input.split:q}"
        " --preset {wildcards.preset:q} {params.settings} --threads {threads:q}"
        " --output {output:q} > {log:q} 2>&1"
