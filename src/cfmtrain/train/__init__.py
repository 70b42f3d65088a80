"""Stage 5: data-parallel MACE training (`cfmtrain train`) for the ablation variants.

Modules: config, data, sampling, model, loss, metrics, loop, checkpoint, summary, build, runner,
cli; distenv maps torchrun/Slurm environments to ranks; repeats runs a cell's repeated runs and
contention judges whether other processes disturbed their timing.
"""
