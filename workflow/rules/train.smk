# Stages 5-6. The ablation trains each group (a data set at a rank count) in paired rounds:
# results/train/<trainset>/r<ranks>/ holds each of the paper's four variants' run (<variant>/),
# rounds.csv and paired.csv, the variants' speed-ups as medians of per-round ratios (target
# `all`, `ablation`). One cell alone, config train.repeats runs of it:
# results/train/<trainset>/<variant>/r<ranks>/summary.json. The check of the baseline against
# mace-torch's own mace_run_train (target `ablation`).


include: "train_inputs.smk"


rule train_group:
    input:
        shards=train_shards,
        split=train_split,
        settings_files=settings_files,
    output:
        paired="results/train/{trainset}/r{ranks}/paired.csv",
        rounds="results/train/{trainset}/r{ranks}/rounds.csv",
        summaries=expand("results/train/{{trainset}}/r{{ranks}}/{variant}/summary.json",
                         variant=ABLATION),
    log:
        "logs/train/{trainset}/r{ranks}.log",
    benchmark:
        "benchmarks/train/{trainset}/r{ranks}.tsv"
    wildcard_constraints:
        trainset=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
        ranks=r"[1-9]\d*",
    params:
        graphs=train_graphs,
        settings=train_settings,
        folder=subpath(output.paired, parent=True),
        cutoff=config["cutoff"],
        variants=ABLATION,
        epochs=TRAIN["rounds"] + 1,  # the first epoch is the untimed warm-up round
    threads: lambda wildcards: int(wildcards.ranks)
        * (TRAIN["settings"].get("threads") or max(1, workflow.cores // int(wildcards.ranks)))
    resources:
        machine=ALONE,
        tasks=lambda wildcards: int(wildcards.ranks),
        cpus_per_task=lambda wildcards, threads: max(1, threads // int(wildcards.ranks)),
        mpi=lambda wildcards: "srun" if int(wildcards.ranks) > 1 else "",
        srun_args="",
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain launch --ranks {wildcards.ranks:q}"
        " --threads {resources.cpus_per_task:q} --srun-args={resources.srun_args:q} -- rounds"
        " --graphs {params.graphs:q} --split {input.split:q} --output {params.folder:q}"
        " --variants {params.variants:q} --dataset {wildcards.trainset:q}"
        " --cutoff {params.cutoff:q} {params.settings} --set epochs={params.epochs:q}"
        " > {log:q} 2>&1"


rule train_cell:
    input:
        shards=train_shards,
        split=train_split,
        settings_files=settings_files,
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
        max_ratio=TRAIN["contention"]["max_wall_cpu_ratio"],
        max_steal=TRAIN["contention"]["max_steal_fraction"],
        max_probe=TRAIN["contention"]["max_probe_slowdown"],
        max_cpu=TRAIN["contention"]["max_cpu_slowdown"],
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
        "python -m cfmtrain cell --repeats {params.repeats:q}"
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
        settings_files=settings_files,
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
