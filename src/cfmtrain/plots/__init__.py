"""Every figure of the project, drawn from results tables (training runs, sweeps, simulations,
benchmarks), never from training: the paper's write a PNG and a PDF, the benchmarks' a PNG."""
