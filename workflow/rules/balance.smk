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
        ranks=" ".join(str(r) for r in config["balance"]["ranks"]),
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
        "python -m cfmtrain balance --graphs {params.graphs} --name {wildcards.dataset}"
        " --capacity {params.capacity} --ranks {params.ranks} --measure {params.measure}"
        " --a {params.a} --b {params.b} --seed {params.seed} --oversize {params.oversize}"
        " --figure-ranks {params.figure_ranks} --figure-steps {params.figure_steps}"
        " --figure-batch {params.figure_batch}"
        " --csv {output.csv} --markdown {output.md} --figure {output.fig} > {log} 2>&1"


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
        "python -m cfmtrain bench balance --preset {wildcards.preset} --capacity {params.capacity}"
        " --seed {params.seed} --output {output} > {log} 2>&1"
