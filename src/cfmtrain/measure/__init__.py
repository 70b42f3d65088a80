"""Measurement: paired comparisons, a group's paired rounds (`cfmtrain rounds`) with its tables,
and an ablation cell's repeated training runs (`cfmtrain cell`)."""
