"""Scaling past one machine: a per-batch cost model fitted from measured runs, an all-reduce
model, and a simulator of per-epoch time at 1 to 740+ ranks for each batching strategy."""
