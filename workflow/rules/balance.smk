# Stage 3: batching. The packing-quality table of every strategy and Figure 12 for a data set
# (sizes from the graph store's per-graph table), and the balancer benchmark.


rule balance_report:
    input:
        graph_shards,
    output:
        csv="results/balance/{dataset}/packing.csv",
        md="results/balance/{dataset}/packing.md",
        fig=report(
            "results/figures/fig12_{dataset}_graphs_per_rank.png",
            caption="../report/fig12.rst",
            category="Balance",
        ),
        pdf="results/figures/fig12_{dataset}_graphs_per_rank.pdf",
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
        figure_ranks=config["balance"]["figure"]["ranks"],
        figure_steps=config["balance"]["figure"]["steps"],
        figure_batch=config["balance"]["figure"]["graphs_per_batch"],
    threads: 1
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain balance --graphs {params.graphs:q} --name {wildcards.dataset:q}"
        " --capacity {params.capacity:q} --ranks {params.ranks:q} --measure {params.measure:q}"
        " --a {params.a:q} --b {params.b:q} --seed {params.seed:q} --oversize {params.oversize:q}"
        " --figure-ranks {params.figure_ranks:q} --figure-steps {params.figure_steps:q}"
        " --figure-batch {params.figure_batch:q}"
        " --csv {output.csv:q} --markdown {output.md:q} --figure {output.fig:q} > {log:q} 2>&1"


rule bench_balance:
    output:
        "results/bench/balance_{preset}.csv",
    log:
        "logs/bench/balance_{preset}.log",
    params:
        capacity=config["balance"]["capacity"],
        seed=config["balance"]["seed"],
    resources:
        timing_slot=1,
    threads: 1
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain bench balance --preset {wildcards.preset:q}"
        " --capacity {params.capacity:q} --seed {params.seed:q} --output {output:q} > {log:q} 2>&1"
