# Simulation past one machine: cost models fitted on the measured runs of one data set, validated
# across rank counts, driving per-epoch time at 1..740+ ranks; results/simulate/<dataset>/<dist>/.


rule simulate_scaling:
    input:
        runs=simulate_runs,
        shards=graph_shards,
    output:
        tables=expand("results/simulate/{{dataset}}/{{distribution}}/{name}",
                      name=SIMULATE_TABLES),
        costmodels="results/simulate/{dataset}/{distribution}/costmodels.json",
        paper="results/simulate/{dataset}/{distribution}/paper.md",
    log:
        "logs/simulate/{dataset}/{distribution}.log",
    benchmark:
        "benchmarks/simulate/{dataset}/{distribution}.tsv"
    wildcard_constraints:
        distribution="table3|dataset",
    params:
        graphs=graph_dirs,
        args=simulate_args,
        out=subpath(output.paper, parent=True),
    threads: 1
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain simulate --runs {input.runs} --graphs {params.graphs}"
        " --distribution {wildcards.distribution} {params.args} --output-dir {params.out}"
        " > {log} 2>&1"
