# Stage 3: batching. The packing-quality table of every strategy for a data set (sizes from the
# graph store's per-graph table; its Figure 12: figures.smk), and the balancer benchmark.


rule balance_report:
    input:
        graph_shards,
    output:
        csv="results/balance/{dataset}/packing.csv",
        md="results/balance/{dataset}/packing.md",
    log:
        "logs/balance/{dataset}.log",
    benchmark:
        "benchmarks/balance/{dataset}.tsv"
    params:
        graphs=graph_dirs,
        capacity=config["balance"]["capacity"],
        ranks=config["balance"]["ranks"],
        measure=config["balance"]["measure"],
        a=config["balance"]["a"],
        b=config["balance"]["b"],
        seed=config["balance"]["seed"],
        oversize=config["balance"]["oversize"],
    threads: 1
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain balance --graphs {params.graphs:q} --name {wildcards.dataset:q}"
        " --capacity {params.capacity:q} --ranks {params.ranks:q} --measure {params.measure:q}"
        " --a {params.a:q} --b {params.b:q} --seed {params.seed:q} --oversize {params.oversize:q}"
        " --csv {output.csv:q} --markdown {output.md:q} > {log:q} 2>&1"


rule bench_balance:
    output:
        "results/bench/balance_{preset}.csv",
    log:
        "logs/bench/balance_{preset}.log",
    params:
        capacity=config["balance"]["capacity"],
        seed=config["balance"]["seed"],
    resources:
        machine=ALONE,
    threads: 1
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain bench balance --preset {wildcards.preset:q}"
        " --capacity {params.capacity:q} --seed {params.seed:q} --output {output:q} > {log:q} 2>&1"
