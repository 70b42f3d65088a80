"""Readers: one per input format (extxyz, ASE db and trajectories, MPtrj JSON), frames out."""
