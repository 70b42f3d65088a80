# Kernel benchmark: fused CPU kernels vs mace-torch (e3nn) and torch.compile of mace-torch.
# `quick` runs in the default target; `full` (200/800/3072 atoms, float32/float64) on demand.


rule bench_kernels:
    output:
        csv="results/bench/kernels_{preset}.csv",
        figure=report(
            "results/figures/fig_kernels_{preset}.png",
            caption="../report/fig_kernels.rst",
            category="Benchmarks",
        ),
    log:
        "logs/bench/kernels_{preset}.log",
    benchmark:
        "benchmarks/bench/kernels_{preset}.tsv"
    threads: 2
    resources:
        timing_slot=1,
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain bench kernels --preset {wildcards.preset:q} --output {output.csv:q}"
        " --figure {output.figure:q} > {log:q} 2>&1"
