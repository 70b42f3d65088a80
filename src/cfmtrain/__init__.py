"""cfmtrain: balanced mini-batches and fused kernels for training MACE chemistry foundation models.

Reproduces Firoz et al., HPDC 2025, as a Snakemake pipeline; see README.md.
"""

__version__ = "0.1.0"
