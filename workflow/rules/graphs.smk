# Stage 2: radius graphs (cutoff from config, periodic images) into sharded HDF5, and the split.


rule graph_shard:
    input:
        shard_frames,
    output:
        shard="results/graphs/{dataset}/shard_{shard}.h5",
        report="results/graphs/{dataset}/shard_{shard}.json",
    log:
        "logs/graphs/{dataset}/shard_{shard}.log",
    benchmark:
        "benchmarks/graphs/{dataset}/shard_{shard}.tsv"
    params:
        frames=lambda wildcards, input: f"{input[0]}/frames_{wildcards.shard}.extxyz",
        cutoff=config["cutoff"],
        skip="--skip-invalid" if config["skip_invalid"] else "",
    threads: 1
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain graphs --input {params.frames:q} --output {output.shard:q}"
        " --report {output.report:q} --cutoff {params.cutoff:q} --dataset {wildcards.dataset:q}"
        " {params.skip} > {log:q} 2>&1"


rule split:
    input:
        split_inputs,
    output:
        "results/graphs/{dataset}/split.npz",
    log:
        "logs/graphs/{dataset}/split.log",
    benchmark:
        "benchmarks/split/{dataset}.tsv"
    params:
        graphs=graph_dirs,
        valid=config["split"]["valid"],
        test=config["split"]["test"],
        seed=config["split"]["seed"],
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain split --graphs {params.graphs:q} --output {output:q}"
        " --valid {params.valid:q} --test {params.test:q} --seed {params.seed:q} > {log:q} 2>&1"
