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
