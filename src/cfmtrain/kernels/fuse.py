"""Swap the fused kernels into a mace-torch model in place, and back.

Parameters are shared, never copied: state_dict keys and values do not change, so an unfused
model is an ordinary mace-torch model that anyone can load.
"""

from __future__ import annotations

import torch

from cfmtrain.kernels.backend import (
    BACKENDS,
    CPU_FUSED,
    CUEQ,
    MACE,
    REFERENCE,
    choose_backend,
    choose_conv_backend,
    mace_conv_backend,
    model_device,
    require_cpu_kernels,
)
from cfmtrain.kernels.conv import factor_radial_weights, fuse_convs, unfuse_convs
from cfmtrain.kernels.cueq import (
    SymmetricContractionCueq,
    cueq_method,
    fuse_cueq_convs,
    unfuse_cueq_convs,
)
from cfmtrain.kernels.linear import fuse_linears, hand_messages_over, unfuse_linears
from cfmtrain.kernels.radial import fold_radial_mlps, unfold_radial_mlps
from cfmtrain.kernels.reshape import fuse_reshapes, unfuse_reshapes
from cfmtrain.kernels.skip import fuse_skips, unfuse_skips
from cfmtrain.kernels.symmetric_contraction import SymmetricContractionFused


def _products(model: torch.nn.Module) -> list[torch.nn.Module]:
    products = getattr(model, "products", None)
    if products is None:
        raise TypeError(f"{type(model).__name__} has no `products`: not a MACE model")
    return list(products)


def _is_swapped(module: torch.nn.Module) -> bool:
    return hasattr(module, "_original")  # SymmetricContractionFused or SymmetricContractionCueq


def fuse_symmetric_contractions(model: torch.nn.Module, backend: str = CPU_FUSED) -> int:
    """Replace every product block's mace SymmetricContraction; returns how many were swapped.

    `backend`: "cpu-fused" (cfmtrain's ops), "reference" (the same fused module on cfmtrain's
    pure-PyTorch evaluator, any device) or "cueq" (cuEquivariance; CUDA kernel on a CUDA device,
    its PyTorch fallback elsewhere).
    """
    from mace.modules.symmetric_contraction import SymmetricContraction

    if backend == CPU_FUSED:
        require_cpu_kernels()  # loudly, before any module is swapped
    swapped = 0
    for product in _products(model):
        sc = product.symmetric_contractions
        if _is_swapped(sc):
            if sc.backend == backend:
                continue  # already on this backend
            sc = sc.original
        elif not isinstance(sc, SymmetricContraction):
            raise TypeError(f"cannot fuse {type(sc).__name__}: build the model with mace's e3nn "
                            "SymmetricContraction (no cueq_config) before fusing")
        if backend in (CPU_FUSED, REFERENCE):
            product.symmetric_contractions = SymmetricContractionFused(sc, backend)
        else:
            method = cueq_method(sc.contractions[0].weights_max.device)
            product.symmetric_contractions = SymmetricContractionCueq(sc, method=method)
        swapped += 1
    return swapped


def fuse_model(model: torch.nn.Module, conv: bool = True,
               backend: str | None = None) -> torch.nn.Module:
    """Swap fused kernels into a MACE / ScaleShiftMACE model in place and return it.

    The backend follows the model's device unless given (see cfmtrain.kernels.backend) and is
    recorded per kernel in `model.cfmtrain_kernel_backend`: "cpu-fused" swaps in cfmtrain's
    kernels, "reference" the same fused symmetric contraction on cfmtrain's pure-PyTorch
    evaluator (kernels.reference), "cueq" mace-torch's cuEquivariance symmetric contraction,
    "mace" leaves mace-torch's e3nn code. The conv (its radial MLP folded too, kernels.radial,
    the MLP's last layer formed inside the conv's kernels, the message's reshape a single
    permutation, kernels.reshape, the message's linear without slice gradients, taking the
    conv's layout, kernels.linear, and the element self-connection one matmul per element,
    kernels.skip) is fused with "cpu-fused"; with "cueq" the conv's channelwise product with its
    gather and scatter runs through cuEquivariance (kernels.cueq). With `conv=False`, or another
    backend, the conv is mace-torch's own ("cueq" if the model was built with cuEquivariance,
    else "mace").
    """
    chosen = backend is None
    device = model_device(model)
    backend = backend or choose_backend(device)
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; choose one of {BACKENDS}")
    if backend == MACE:
        unfuse_model(model)
    else:
        fuse_symmetric_contractions(model, backend)
    if backend == CPU_FUSED and conv:  # the conv with its weight path (the radial MLP)
        unfuse_cueq_convs(model)
        fuse_convs(model)
        fold_radial_mlps(model)
        factor_radial_weights(model)
        fuse_reshapes(model)
        fuse_linears(model)
        hand_messages_over(model)
        fuse_skips(model)
        conv_backend = CPU_FUSED
    elif backend == CUEQ and conv:
        _unfuse_convs(model)
        fuse_cueq_convs(model)
        conv_backend = CUEQ
    else:
        _unfuse_convs(model)
        conv_backend = mace_conv_backend(model)
        if chosen and backend != CPU_FUSED:  # a device without our kernels: warn once
            conv_backend = choose_conv_backend(device, model)
    model.cfmtrain_kernel_backend = {"symmetric_contraction": backend, "conv": conv_backend}
    return model


def unfuse_model(model: torch.nn.Module) -> torch.nn.Module:
    """Restore mace-torch's original modules in place (same parameters) and return the model."""
    for product in _products(model):
        sc = product.symmetric_contractions
        if _is_swapped(sc):
            product.symmetric_contractions = sc.original
    _unfuse_convs(model)
    if hasattr(model, "cfmtrain_kernel_backend"):
        del model.cfmtrain_kernel_backend
    return model


def _unfuse_convs(model: torch.nn.Module) -> None:
    """mace-torch's own conv path back in every block, whichever backend fused it."""
    unfuse_convs(model)
    unfuse_cueq_convs(model)
    unfold_radial_mlps(model)
    unfuse_reshapes(model)
    unfuse_linears(model)
    unfuse_skips(model)
