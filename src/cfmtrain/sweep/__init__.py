"""Sweeps behind Figure 11 and section 5.5: time per training step against batch size (small and
large molecules, float32 and float64) and against bin capacity, and the simulator's calibration
(the cells' own model per compute path), measured in subprocesses."""
