"""Scaling past one machine: a per-batch cost model fitted on a calibration of the cells' model
and validated on the measured cells, an all-reduce model, and a simulator of per-epoch time at 1
to 740+ ranks for each batching strategy, with the fit's band and its verdict."""
