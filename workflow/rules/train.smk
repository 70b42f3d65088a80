# Stages 5-6: one training cell per target, results/train/<trainset>/<variant>/r<ranks>/summary.json
# (config train.repeats runs of it into rep1/, rep2/, ...: the median, min-max and contention
# flags; the median run's final.model, steps.csv and epochs.csv beside it), and the check of the baseline against mace-torch's own mace_run_train (target `ablation`).


include: "train_inputs.smk"


rule train_cell:
    input:
        shards=train_shards,
        split=train_split,
    output:
        "results/train/{trainset}/{variant}/r{ranks}/summary.json",
    log:
        "logs/train/{trainset}/{variant}/r{ranks}.log",
    benchmark:
        "benchmarks/train/{trainset}/{variant}/r{ranks}.tsv"
    wildcard_constraints:
        trainset=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
        variant="|".join(VARIANTS),
        ranks=r"[1-9]\d*",
    params:
        graphs=train_graphs,
        settings=train_settings,
        folder=lambda wildcards, output: os.path.dirname(output[0]),
        cutoff=config["cutoff"],
        repeats=TRAIN["repeats"],
        remeasure=TRAIN["remeasure"],
        remeasure_seconds=TRAIN["remeasure_seconds"],
        max_ratio=TRAIN["contention"]["max_wall_cpu_ratio"],
        max_steal=TRAIN["contention"]["max_steal_fraction"],
        max_probe=TRAIN["contention"]["max_probe_slowdown"],
        max_cpu=TRAIN["contention"]["max_cpu_slowdown"],
    # the matrix group by group (ablation_targets' order): a figure's variants are timed back
    # to back
    priority: cell_priority
    # ranks x threads per rank (config train.settings.threads; 0 or unset: the cores / ranks),
    # capped by --cores locally and by the profile's max-threads under Slurm
    threads: lambda wildcards: int(wildcards.ranks)
        * (TRAIN["settings"].get("threads") or max(1, workflow.cores // int(wildcards.ranks)))
    resources:
        machine=ALONE,
        tasks=lambda wildcards: int(wildcards.ranks),  # one Slurm task per rank (sbatch --ntasks)
        # threads per rank: sbatch and srun --cpus-per-task, torch threads of each rank
        cpus_per_task=lambda wildcards, threads: max(1, threads // int(wildcards.ranks)),
        # "srun": the batch script runs the command itself (launch calls srun), not inside the
        # executor's `srun -n1`; "" for one rank (the executor refuses mpi with one task)
        mpi=lambda wildcards: "srun" if int(wildcards.ranks) > 1 else "",
        srun_args="",  # extra srun options, e.g. GPU binding (profiles/slurm-gpu sets them)
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain cell --repeats {params.repeats:q} --remeasure {params.remeasure:q}"
        " --remeasure-seconds {params.remeasure_seconds:q}"
        " --max-wall-cpu-ratio {params.max_ratio:q}"
        " --max-steal-fraction {params.max_steal:q} --max-probe-slowdown {params.max_probe:q}"
        " --max-cpu-slowdown {params.max_cpu:q}"
        " --ranks {wildcards.ranks:q}"
        " --threads {resources.cpus_per_task:q} --srun-args={resources.srun_args:q} -- train --graphs {params.graphs:q}"
        " --split {input.split:q} --output {params.folder:q} --variant {wildcards.variant:q}"
        " --dataset {wildcards.trainset:q} --cutoff {params.cutoff:q} {params.settings}"
        " --resume auto > {log:q} 2>&1"


rule baseline_check:
    input:
        shards=train_shards,
        split=train_split,
    output:
        json="results/train/{trainset}/baseline_check.json",
        csv="results/train/{trainset}/baseline_check.csv",
    log:
        "logs/train/{trainset}/baseline_check.log",
    wildcard_constraints:
        trainset=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    params:
        graphs=train_graphs,
        settings=train_settings,
    threads: workflow.cores
    resources:
        machine=ALONE,
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain baseline-check --graphs {params.graphs:q} --split {input.split:q}"
        " --output {output.json:q} --dataset {wildcards.trainset:q} {params.settings}"
        " --threads {threads:q} > {log:q} 2>&1"
