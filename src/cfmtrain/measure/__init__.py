"""Measurement: an ablation cell's repeated training runs (`cfmtrain cell`)."""
