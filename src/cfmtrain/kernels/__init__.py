"""Fused CPU kernels for MACE (symmetric contraction; the conv in cfmtrain.kernels.conv).

`fuse_model(model)` swaps them into a mace-torch model in place; `unfuse_model` swaps back;
`prepare_for_compile(model)` readies a fused model for torch.compile (`without_codegen` first for
a model loaded from a file; cfmtrain.kernels.compile).
"""

from cfmtrain.kernels.backend import choose_backend, kernel_backend
from cfmtrain.kernels.compile import prepare_for_compile, without_codegen
from cfmtrain.kernels.fuse import fuse_model, unfuse_model

__all__ = ["choose_backend", "fuse_model", "kernel_backend", "prepare_for_compile",
           "unfuse_model", "without_codegen"]
