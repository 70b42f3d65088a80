"""Distribution: ranks from torchrun/Slurm environments, launching them, and contention checks."""
