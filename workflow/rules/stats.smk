# Data set statistics: the paper's Table 3 and Figure 5 for each data set.


rule stats_dataset:
    input:
        graph_shards,
    output:
        csv="results/stats/{dataset}/table3.csv",
        md="results/stats/{dataset}/table3.md",
        fig=report(
            "results/figures/fig05_{dataset}_sizes.png",
            caption="../report/fig05.rst",
            category="Data",
        ),
    log:
        "logs/stats/{dataset}.log",
    params:
        graphs=graph_dirs,
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain stats --graphs {params.graphs:q} --name {wildcards.dataset:q}"
        " --csv {output.csv:q} --markdown {output.md:q} --figure {output.fig:q} > {log:q} 2>&1"
