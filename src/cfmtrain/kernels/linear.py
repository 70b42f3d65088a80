"""MACE's message linear (e3nn's `o3.Linear` after the conv) without per-block slice gradients.

e3nn slices each of the message's irrep blocks out with `narrow`; the backward of every slice
writes a zero tensor the size of the whole message and copies its block in, and the blocks'
gradients are then summed (at lmax 3 ten blocks: ten zero fills, copies and nine additions of a
[nodes, message] tensor per backward, again in the second backward of a force-trained step).
Here the blocks are views of one `split` (its backward is one concatenation) and the blocks of
one irrep type are multiplied by their stacked weights at once. Same function, same parameters.
"""

from __future__ import annotations

import torch
from e3nn import o3


def _fusable(linear: torch.nn.Module) -> bool:
    """An e3nn Linear with internal shared weights and no biases."""
    return (isinstance(linear, o3.Linear) and linear.internal_weights and linear.shared_weights
            and linear.bias_numel == 0)


class FusedLinear(torch.nn.Module):
    """Drop-in for an e3nn `o3.Linear` (internal shared weights, no biases); it adopts the
    Linear's parameters and buffers under the same names (state_dict unchanged), and `restore()`
    gives the Linear back."""

    def __init__(self, linear: o3.Linear) -> None:
        super().__init__()
        if not _fusable(linear):
            raise TypeError(f"FusedLinear: need internal shared weights and no biases, got "
                            f"{linear}")
        self.irreps_in, self.irreps_out = linear.irreps_in, linear.irreps_out
        for name, child in linear.named_children():
            self.add_module(name, child)
        for name, param in linear.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for name, buf in linear.named_buffers(recurse=False):
            self.register_buffer(name, buf,
                                 persistent=name not in linear._non_persistent_buffers_set)
        # per output block: the instructions (their index, input block, path weight) into it
        self.into = [[(k, ins.i_in, ins.path_weight) for k, ins in enumerate(linear.instructions)
                      if ins.i_out == i_out] for i_out in range(len(self.irreps_out))]
        self.__dict__["_original"] = linear  # not a submodule: not in state_dict or .modules()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[:-1]
        x = x.reshape(-1, self.irreps_in.dim)
        blocks = torch.split(x, [mul_ir.dim for mul_ir in self.irreps_in], dim=1)
        views = list(self._original.weight_views(self.weight))
        outs = []
        for paths, (mul_out, ir) in zip(self.into, self.irreps_out, strict=True):
            if not paths or mul_out == 0:
                outs.append(x.new_zeros(x.shape[0], mul_out * ir.dim))
                continue
            # [nodes, sum of input muls, dim] x [sum of input muls, mul_out]: one matmul
            xs = [blocks[i].reshape(x.shape[0], -1, ir.dim) for _, i, _ in paths]
            ws = [views[k] * alpha for k, _, alpha in paths]
            xs, w = (xs[0], ws[0]) if len(xs) == 1 else (torch.cat(xs, 1), torch.cat(ws, 0))
            outs.append(torch.einsum("zui,uw->zwi", xs, w).reshape(x.shape[0], -1))
        out = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
        return out.reshape(*rows, self.irreps_out.dim)

    def __reduce__(self) -> tuple:
        """Pickle as the e3nn Linear (its own save logic) and swap this in on load."""
        return _fused_linear, (self.restore(), self.training)

    def restore(self) -> o3.Linear:
        """The original Linear, holding this module's current parameters and buffers."""
        linear = self._original
        for name in list(linear._parameters):
            linear._parameters[name] = self._parameters[name]
        for name in list(linear._buffers):
            linear._buffers[name] = self._buffers[name]
        for name, child in self.named_children():
            linear._modules[name] = child
        return linear


def _fused_linear(linear: o3.Linear, training: bool) -> FusedLinear:
    """Unpickles a FusedLinear (see its `__reduce__`)."""
    module = FusedLinear(linear)
    module.training = training
    return module


def _interaction_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "conv_tp") and hasattr(m, "linear")]


def fuse_linears(model: torch.nn.Module) -> int:
    """Swap FusedLinear in for every interaction block's message `linear` that is an e3nn Linear
    with internal shared weights and no biases, in place; returns how many are fused."""
    fused = 0
    for block in _interaction_blocks(model):
        if not isinstance(block.linear, FusedLinear) and _fusable(block.linear):
            block.linear = FusedLinear(block.linear)
        fused += isinstance(block.linear, FusedLinear)
    return fused


def unfuse_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Put e3nn's Linears back (the inverse of `fuse_linears`), in place."""
    for block in _interaction_blocks(model):
        if isinstance(block.linear, FusedLinear):
            block.linear = block.linear.restore()
    return model
