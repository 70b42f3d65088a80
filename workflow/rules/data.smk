# Stage 1: data sets -> extxyz frame shards (results/data/<dataset>/frames/frames_NNNN.extxyz).


# Partial data (<file>.part and its validators <file>.part.json) live outside the output
# folder: Snakemake deletes a failed job's output, and the next run resumes from them.
rule download:
    output:
        directory("results/downloads/{dataset}"),
    log:
        "logs/download/{dataset}.log",
    params:
        registry=lambda wc: dataset_config(wc).get("registry", wc.dataset),
        partial="results/downloads/.partial/{dataset}",
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain download {params.registry:q} --dest {output:q} "
        "--partial-dir {params.partial:q} > {log} 2>&1"


rule frames:
    input:
        frames_inputs,
    output:
        directory("results/data/{dataset}/frames"),
    log:
        "logs/frames/{dataset}.log",
    benchmark:
        "benchmarks/frames/{dataset}.tsv"
    params:
        command=frames_command,
    threads: 2
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "{params.command} > {log} 2>&1"
