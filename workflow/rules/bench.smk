# Benchmarks: each prints a table and writes results/bench/<name>_<preset>.csv.
from cfmtrain.bench.scale import train_overrides


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


# The data path against the graph count (docs/scale.md); not in `all`: target `scale`. Each
# count is a data set scale_<count> of the pipeline's own rules (generate, graph shards as a job
# array under Slurm, split), trained briefly here; bench_scale reads their benchmark files.
rule scale_train:
    input:
        shards=graph_shards,
        split="results/graphs/{dataset}/split.npz",
    output:
        timeline="results/scale/{dataset}/timeline.json",
        steps="results/scale/{dataset}/steps.csv",
    log:
        "logs/scale/{dataset}.log",
    wildcard_constraints:
        dataset=r"scale_\d+",
    params:
        graphs=graph_dirs,
        folder=lambda wildcards, output: os.path.dirname(output.timeline),
        cutoff=config["cutoff"],
        settings=command(*train_overrides(SCALE["steps"])),
        ranks=SCALE["ranks"],
    threads: SCALE["ranks"]  # a thread a rank
    resources:
        machine=ALONE,
        tasks=SCALE["ranks"],
        cpus_per_task=1,
        mpi="srun",
        srun_args="",
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain launch --ranks {params.ranks} --threads 1"
        " --srun-args={resources.srun_args:q} -- train --graphs {params.graphs:q}"
        " --split {input.split:q} --output {params.folder:q} --variant both"
        " --dataset {wildcards.dataset:q} --cutoff {params.cutoff:q} {params.settings}"
        " > {log:q} 2>&1"


rule bench_scale:
    input:
        expand("results/scale/scale_{count}/timeline.json", count=SCALE["graphs"]),
    output:
        csv="results/bench/scale.csv",
        figure="results/figures/fig_scale.png",
    log:
        "logs/bench/scale.log",
    params:
        settings=command(*settings_option(config, "scale")),
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain bench scale --from-pipeline . {params.settings}"
        " --output {output.csv:q} --figure {output.figure:q} > {log:q} 2>&1"
