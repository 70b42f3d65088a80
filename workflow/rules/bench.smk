# Benchmarks: each prints a table and writes results/bench/<name>_<preset>.csv.


rule bench_graphs:
    output:
        "results/bench/graphs_{preset}.csv",
    log:
        "logs/bench/graphs_{preset}.log",
    resources:
        timing_slot=1,
    threads: 2  # single-threaded, but it reserves the machine: nothing runs beside a timing
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
        timing_slot=1,
    threads: 2  # one core timed; the other kept free so that nothing runs beside a timing
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain bench loader --preset {wildcards.preset:q} --output {output:q}"
        " > {log:q} 2>&1"
