"""Benchmarks: each prints a table and writes CSV under results/bench/."""
