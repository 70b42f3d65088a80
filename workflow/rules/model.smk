# Stage 7 (target `model`, not in `all`): a model to publish per data set of config
# `model.datasets`. One training (`cfmtrain train`, the model preset with config model.settings
# over it, on model.ranks ranks) into results/model/<set>/: best.model (the lowest validation
# loss; the one to use), final.model (the last epoch's), epochs.csv, summary.json; a stop
# (preemption, SIGTERM) leaves a checkpoint there that the rerun resumes. Then the best model's
# errors on the test split: evaluation.csv, parity.png and learning_curves.png.


include: "model_inputs.smk"


# summary.json alone is declared: Snakemake deletes a failed job's outputs, and the checkpoint,
# epochs.csv and best.model beside it are what a resumed run goes on from
rule model_train:
    input:
        shards=model_shards,
        split="results/graphs/{mset}/split.npz",
        others=model_files,
    output:
        "results/model/{mset}/summary.json",
    log:
        "logs/model/{mset}.log",
    wildcard_constraints:
        mset="|".join(map(re.escape, MODEL_SETS)) or "NONE",
    params:
        graphs=model_graphs,
        settings=model_settings,
        replay=model_replay,
        folder=lambda wildcards, output: os.path.dirname(output[0]),
        cutoff=config["cutoff"],
        ranks=MODEL["ranks"],
    threads: model_threads(MODEL["ranks"])
    resources:
        tasks=MODEL["ranks"],  # one Slurm task per rank (sbatch --ntasks)
        cpus_per_task=lambda wildcards, threads: max(1, threads // MODEL["ranks"]),
        mpi="srun" if MODEL["ranks"] > 1 else "",  # launch calls srun (as train_cell)
        srun_args="",  # e.g. GPU binding (profiles/slurm-gpu)
        gpu=MODEL["ranks"] * MODEL["gpus_per_rank"],  # sbatch --gpus (0: none asked)
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain launch --ranks {params.ranks:q}"
        " --threads {resources.cpus_per_task:q} --srun-args={resources.srun_args:q} -- train"
        " --graphs {params.graphs:q} --split {input.split:q} --output {params.folder:q}"
        " --dataset {wildcards.mset:q} --cutoff {params.cutoff:q} {params.settings}"
        " {params.replay} --resume auto > {log:q} 2>&1"


rule model_evaluate:
    input:
        summary="results/model/{mset}/summary.json",
        shards=model_shards,
        split="results/graphs/{mset}/split.npz",
    output:
        csv="results/model/{mset}/evaluation.csv",
        parity="results/model/{mset}/parity.png",
        parity_table="results/model/{mset}/parity.csv",
        curves="results/model/{mset}/learning_curves.png",
    log:
        "logs/model/{mset}_evaluate.log",
    wildcard_constraints:
        mset="|".join(map(re.escape, MODEL_SETS)) or "NONE",
    params:
        graphs=model_graphs,
        folder=lambda wildcards, input: os.path.dirname(input.summary),
    threads: 1
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain evaluate --model {params.folder:q}/best.model"
        " --graphs {params.graphs:q} --split {input.split:q} --part test"
        " --epochs {params.folder:q}/epochs.csv --output {output.csv:q}"
        " --parity {output.parity:q} --curves {output.curves:q}"
        " --title {wildcards.mset:q} > {log:q} 2>&1"
