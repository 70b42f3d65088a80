"""Benchmarks: each prints a table and writes CSV under results/bench/."""

# Untimed calls before a benchmark's timed ones, after its first: TorchScript's profiling
# executor (e3nn's scripted spherical harmonics and linears, in mace-torch and fused models
# alike) profiles and optimises its graphs over the first calls. On the paper model's training
# step (800 atoms) it added 82 and 153 ms to the third and fourth calls and nothing from the
# fifth; in MD (MP-0 medium, 1k water) the second call took 1.85 s against 1.33-1.36 later.
WARMUP_CALLS = 3
