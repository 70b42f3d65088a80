# Benchmarks: each prints a table and writes results/bench/<name>_<preset>.csv.


rule bench_graphs:
    output:
        "results/bench/graphs_{preset}.csv",
    log:
        "logs/bench/graphs_{preset}.log",
    resources:
        machine=ALONE,
    threads: 1  # single-threaded; machine=ALONE keeps other jobs off the machine while it times
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain bench graphs --preset {wildcards.preset:q} --output {output:q}"
        " > {log:q} 2>&1"


rule bench_loader:
    output:
        "results/bench/loader_{preset}.csv",
    log:
        "logs/bench/loader_{preset}.log",
    resources:
        machine=ALONE,
    threads: 1  # one core timed; machine=ALONE keeps other jobs off the machine while it times
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain bench loader --preset {wildcards.preset:q} --output {output:q}"
        " > {log:q} 2>&1"


# The data path against the graph count (docs/scale.md); not in `all`: target `scale`.
rule bench_scale:
    output:
        csv="results/bench/scale.csv",
        figure="results/figures/fig_scale.png",
    log:
        "logs/bench/scale.log",
    params:
        graphs=config["scale"]["graphs"],
        steps=config["scale"]["steps"],
    resources:
        machine=ALONE,
    threads: 2  # 2 generate and graphs processes, then 2 training ranks
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain bench scale --graphs {params.graphs} --steps {params.steps}"
        " --workers {threads} --output {output.csv:q} --figure {output.figure:q} > {log:q} 2>&1"
