"""Data-parallel MACE training (`cfmtrain train`) for the ablation variants: config, sampling,
model, loss, metrics, loop, checkpoint, summary, build, runner, cli."""
