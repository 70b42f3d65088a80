# Data set statistics: the paper's Table 3 for each data set (its Figure 5: figures.smk).


rule stats_dataset:
    input:
        graph_shards,
    output:
        csv="results/stats/{dataset}/table3.csv",
        md="results/stats/{dataset}/table3.md",
    log:
        "logs/stats/{dataset}.log",
    params:
        graphs=graph_dirs,
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain stats --graphs {params.graphs:q} --name {wildcards.dataset:q}"
        " --csv {output.csv:q} --markdown {output.md:q} > {log:q} 2>&1"
