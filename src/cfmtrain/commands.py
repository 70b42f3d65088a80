"""The table of `cfmtrain` commands: each one's module, its one-line help and whether it runs
with the tuned allocator. The command line (cfmtrain.cli) runs them; `cfmtrain docs` writes
docs/cli.md from their parsers.
"""

from __future__ import annotations

# command -> (module, help, needs the tuned allocator)
COMMANDS: dict[str, tuple[str, str, bool]] = {
    "generate": ("cfmtrain.sources.mini", "generate a data set offline (extxyz): `mini` or the "
                 "MPtrj-like `crystals` of any size", False),
    "download": ("cfmtrain.sources.download", "download a registered data set", False),
    "convert": ("cfmtrain.shards.convert", "convert a data set's files, registered or own "
                "(--own-data), of any input format to extxyz shards", False),
    "split": ("cfmtrain.graphs.split", "write the seeded train/valid/test split", False),
    "graphs": ("cfmtrain.graphs.build", "build radius graphs into an HDF5 shard", False),
    "stats": ("cfmtrain.graphs.stats", "data set statistics: Table 3", False),
    "balance": ("cfmtrain.balance.report", "packing-quality table of every strategy", False),
    "bench": ("cfmtrain.bench.cli", "benchmarks: graphs, balance, kernels, isa, md, loader, "
              "accuracy, host, compare, scale, gpu", True),
    "launch": ("cfmtrain.ranks.launch", "run R ranks: srun under Slurm, else torchrun", False),
    "train": ("cfmtrain.train.cli", "data-parallel MACE training (one run)", True),
    "cell": ("cfmtrain.measure.repeats", "one ablation cell: repeated training runs, their "
             "median and spread", False),
    "rounds": ("cfmtrain.measure.rounds", "an ablation group: its variants trained in paired "
               "rounds, their speed-ups as medians of per-round ratios", True),
    "evaluate": ("cfmtrain.evaluate.cli", "a trained model's errors (energy, forces, stress; "
                 "MAE, RMSE) per config_type on a split or a file of frames, its parity plot "
                 "and learning curves", False),
    "baseline-check": ("cfmtrain.bench.baseline_check", "baseline step time against "
                       "mace-torch's own mace_run_train", True),
    "sweep": ("cfmtrain.sweep.cli", "batch-size and bin-capacity sweeps", True),
    "simulate": ("cfmtrain.simulate.cli", "cost model and epoch-time simulator", False),
    "goals": ("cfmtrain.plots.goals", "the ablation's goals (spread, ordering, "
              "speed-up) checked on the training cells of consecutive runs", False),
    "docs": ("cfmtrain.docs", "the generated documentation: the README's results table, the "
             "benchmark tables, the config, command-line and API references", False),
    "figure": ("cfmtrain.plots.cli", "one figure of the paper from results files: its table "
               "(CSV), then the image", False),
}

