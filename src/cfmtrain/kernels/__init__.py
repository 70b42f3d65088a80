"""Fused CPU kernels for MACE (symmetric contraction; the conv in cfmtrain.kernels.conv).

`fuse_model(model)` swaps them into a mace-torch model in place; `unfuse_model` swaps back.
"""

from cfmtrain.kernels.backend import choose_backend, kernel_backend
from cfmtrain.kernels.fuse import fuse_model, unfuse_model

__all__ = ["choose_backend", "fuse_model", "kernel_backend", "unfuse_model"]
