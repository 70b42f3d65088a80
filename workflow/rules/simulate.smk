# Simulation past one machine: cost laws fitted on the calibration of the cells' model, the data
# wait of the measured runs, judged on the groups' paired speed-ups (one group held out),
# driving per-epoch time at 1..740+ ranks in the CPU (measured) and accelerator (assumed) cases;
# results/simulate/<dataset>/<dist>/.


rule simulate_scaling:
    input:
        runs=simulate_runs,
        groups=simulate_groups,
        calibration=simulate_calibration,
        shards=train_shards,
    output:
        tables=expand("results/simulate/{{trainset}}/{{distribution}}/{name}",
                      name=SIMULATE_TABLES),
        costmodels="results/simulate/{trainset}/{distribution}/costmodels.json",
        paper="results/simulate/{trainset}/{distribution}/paper.md",
    log:
        "logs/simulate/{trainset}/{distribution}.log",
    benchmark:
        "benchmarks/simulate/{trainset}/{distribution}.tsv"
    wildcard_constraints:
        trainset=r"[A-Za-z0-9][A-Za-z0-9_.-]*",  # a data set or a train size such as mini_s
        distribution="table3|dataset",
    params:
        graphs=train_graphs,
        groups=lambda wildcards, input: [os.path.dirname(p) for p in input.groups],
        args=simulate_args,
        out=subpath(output.paper, parent=True),
    threads: 1
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain simulate --runs {input.runs:q} --groups {params.groups:q}"
        " --calibration {input.calibration:q}"
        " --graphs {params.graphs:q} {params.args} --output-dir {params.out:q}"
        " > {log:q} 2>&1"
