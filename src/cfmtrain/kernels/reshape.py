"""mace-torch's `reshape_irreps` (features in mul_ir layout -> [nodes, mul, (lmax + 1)^2]) as one
column permutation.

mace-torch slices each irrep out, reshapes it and concatenates the pieces; the backward of every
slice writes a zero tensor the size of the whole input and copies its part in (four zero fills
and copies of [nodes, features] per call at lmax 3, and again in the second backward of a
force-trained step). A permutation's derivative is the inverse permutation, so every derivative
order here is one gather (conv._Permute). Same numbers, no arithmetic.
"""

from __future__ import annotations

import torch

from cfmtrain.kernels.conv import _permute


def _fusable(module: torch.nn.Module) -> bool:
    """True for a reshape of irreps of one multiplicity in mul_ir layout."""
    cueq = getattr(module, "cueq_config", None)
    mul_ir = cueq is None or getattr(cueq, "layout_str", "mul_ir") == "mul_ir"
    return mul_ir and len(set(module.muls)) == 1


def reshape_order(muls: list[int], dims: list[int]) -> torch.Tensor:
    """Input column of each output entry [u, k] (flattened) of reshape_irreps for irreps of
    multiplicities `muls` (all equal) and dimensions `dims`."""
    mul, offsets, start = muls[0], [], 0
    for m, d in zip(muls, dims, strict=True):
        offsets.append(start)
        start += m * d
    order = [off + u * d + k for u in range(mul) for off, d in zip(offsets, dims, strict=True)
             for k in range(d)]
    return torch.tensor(order, dtype=torch.int64)


class FusedReshape(torch.nn.Module):
    """Drop-in for mace-torch's `reshape_irreps` (mul_ir layout, one multiplicity): x[:, order]
    viewed as [nodes, mul, dims]; `restore()` gives the original module back."""

    def __init__(self, original: torch.nn.Module) -> None:
        super().__init__()
        muls, dims = list(original.muls), list(original.dims)
        if not _fusable(original):
            raise TypeError(f"FusedReshape: irreps of one multiplicity in mul_ir layout only, "
                            f"got multiplicities {muls}")
        self.mul, self.width = muls[0], sum(dims)
        order = reshape_order(muls, dims)
        self.register_buffer("order", order, persistent=False)
        self.register_buffer("inverse", order.argsort(), persistent=False)
        self.__dict__["_original"] = original  # not a submodule: not in state_dict or .modules()

    def forward(self, tensor: torch.Tensor) -> torch.Tensor:
        order = (self.order.to(tensor.device), self.inverse.to(tensor.device))
        return _permute(tensor, order).view(tensor.shape[0], self.mul, self.width)

    def __reduce__(self) -> tuple:
        """Pickle as mace-torch's module and swap this one in again on load."""
        return _fused_reshape, (self._original, self.training)

    def restore(self) -> torch.nn.Module:
        """The original reshape_irreps."""
        return self._original


def _fused_reshape(original: torch.nn.Module, training: bool) -> FusedReshape:
    """Unpickles a FusedReshape (see its `__reduce__`)."""
    module = FusedReshape(original)
    module.training = training
    return module


def fuse_reshapes(model: torch.nn.Module) -> int:
    """Swap FusedReshape into every interaction block whose `reshape` is mace-torch's
    reshape_irreps of one multiplicity in mul_ir layout, in place; returns how many are fused."""
    from mace.modules.irreps_tools import reshape_irreps

    fused = 0
    for block in model.modules():
        original = getattr(block, "reshape", None)
        if isinstance(original, reshape_irreps) and _fusable(original):
            block.reshape = FusedReshape(original)
        fused += isinstance(getattr(block, "reshape", None), FusedReshape)
    return fused


def unfuse_reshapes(model: torch.nn.Module) -> torch.nn.Module:
    """Put mace-torch's reshape_irreps back (the inverse of `fuse_reshapes`), in place."""
    for block in model.modules():
        if isinstance(getattr(block, "reshape", None), FusedReshape):
            block.reshape = block.reshape.restore()
    return model
