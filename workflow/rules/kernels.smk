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
        machine=ALONE,
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain bench kernels --preset {wildcards.preset:q} --output {output.csv:q}"
        " --figure {output.figure:q} > {log:q} 2>&1"


# MD through MACECalculator, fused vs mace-torch (`paper-model`: MP-0 medium shape, 5k atoms, ~1 h on
# 2 cores; `full`: 1k/5k/20k atoms, small and medium shapes). Not in `all`: target `md`.
rule bench_md:
    output:
        csv="results/bench/md_{mdpreset}.csv",
        figure=report(
            "results/figures/fig_md_{mdpreset}.png",
            caption="../report/fig_md.rst",
            category="Benchmarks",
        ),
    wildcard_constraints:
        mdpreset="test|paper-model|full|goals",
    log:
        "logs/bench/md_{mdpreset}.log",
    threads: 2
    resources:
        machine=ALONE,
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain bench md --preset {wildcards.mdpreset:q} --output {output.csv:q}"
        " --figure {output.figure:q} > {log:q} 2>&1"
