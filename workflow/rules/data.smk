# Stage 1: data sets -> extxyz frame shards (results/data/<dataset>/frames/frames_NNNN.extxyz).


rule download:
    output:
        directory("results/downloads/{dataset}"),
    log:
        "logs/download/{dataset}.log",
    params:
        registry=lambda wc: dataset_config(wc).get("registry", wc.dataset),
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain download {params.registry} --dest {output} > {log} 2>&1"


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
