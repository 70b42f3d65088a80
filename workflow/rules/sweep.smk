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
        timing_slot=1,
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain sweep batch --graphs {params.graphs:q} --split {input.split:q}"
        " --preset {wildcards.preset:q} {params.args} --output {output:q} > {log:q} 2>&1"


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
        timing_slot=1,
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain sweep capacity --graphs {params.graphs:q} --split {input.split:q}"
        " --preset {wildcards.preset:q} {params.args} --output {output.csv:q}"
        " --recommendation {output.json:q} > {log:q} 2>&1"
