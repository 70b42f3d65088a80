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

from cfmtrain.kernels.adopt import Adopting, swap_in, swap_out
from cfmtrain.kernels.conv import _interaction_blocks


def _fusable(linear: torch.nn.Module) -> bool:
    """An e3nn Linear with internal shared weights and no biases."""
    return (isinstance(linear, o3.Linear) and linear.internal_weights and linear.shared_weights
            and linear.bias_numel == 0)


class FusedLinear(Adopting):
    """Drop-in for an e3nn `o3.Linear` (internal shared weights, no biases); it adopts the
    Linear's parameters and buffers under the same names (state_dict unchanged), and `restore()`
    gives the Linear back."""

    def __init__(self, linear: o3.Linear) -> None:
        if not _fusable(linear):
            raise TypeError(f"FusedLinear: need internal shared weights and no biases, got "
                            f"{linear}")
        super().__init__(linear)
        self.irreps_in, self.irreps_out = linear.irreps_in, linear.irreps_out
        # per output block: the instructions (their index, input block, path weight) into it
        self.into = [[(k, ins.i_in, ins.path_weight) for k, ins in enumerate(linear.instructions)
                      if ins.i_out == i_out] for i_out in range(len(self.irreps_out))]

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

def fuse_linears(model: torch.nn.Module) -> int:
    """Swap FusedLinear in for every interaction block's message `linear` that is an e3nn Linear
    with internal shared weights and no biases, in place; returns how many are fused."""
    return swap_in(_interaction_blocks(model), "linear", FusedLinear, _fusable)


def unfuse_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Put e3nn's Linears back (the inverse of `fuse_linears`), in place."""
    swap_out(_interaction_blocks(model), "linear", FusedLinear)
    return model
