"""Batches: a GraphStore's graphs as mace-torch Batches, per rank, with prefetching."""
