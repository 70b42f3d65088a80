"""MACE's message linear (e3nn's `o3.Linear` after the conv) without per-block slice gradients.

e3nn slices each of the message's irrep blocks out with `narrow`; the backward of every slice
writes a zero tensor the size of the whole message and copies its block in, and the blocks'
gradients are then summed (at lmax 3 ten blocks: ten zero fills, copies and nine additions of a
[nodes, message] tensor per backward, again in the second backward of a force-trained step).
Here the blocks are views of one `split` (its backward is one concatenation) and the blocks of
one irrep type are multiplied by their stacked weights at once. Same function, same parameters.

Where the block's fused conv hands it the message in the kernels' ir_mul layout
(`hand_messages_over`), a block is [nodes, dim, mul] and its matmul needs no transposition: the
conv's permutation to e3nn's mul_ir (an index_select over [nodes, message] in each pass) and
einsum's transposition back are both gone.
"""

from __future__ import annotations

import torch
from e3nn import o3

from cfmtrain.kernels.adopt import Adopting, swap_in, swap_out
from cfmtrain.kernels.conv import FusedChannelwiseConv, _interaction_blocks
from cfmtrain.kernels.dense import dense_matmul

# mace-torch blocks whose forward passes the conv's message to `linear` and nowhere else (only
# truncate_ghosts, a row slice, between them): their conv may hand it over in ir_mul
HAND_OVER_BLOCKS = ("RealAgnosticInteractionBlock", "RealAgnosticResidualInteractionBlock",
                    "RealAgnosticAttResidualInteractionBlock",
                    "RealAgnosticDensityInteractionBlock",
                    "RealAgnosticDensityResidualInteractionBlock")


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
        # plain ints for forward (torch.compile cannot guard on e3nn's Irreps)
        self.in_dims = [mul_ir.dim for mul_ir in self.irreps_in]
        self.out_blocks = [(mul, ir.dim) for mul, ir in self.irreps_out]
        self.in_dim, self.out_dim = self.irreps_in.dim, self.irreps_out.dim
        self.ir_mul_input = False  # set by the conv that hands over (FusedChannelwiseConv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[:-1]
        x = x.reshape(-1, self.in_dim)
        blocks = torch.split(x, self.in_dims, dim=1)
        views = list(self._original.weight_views(self.weight))
        outs = []
        for paths, (mul_out, ir_dim) in zip(self.into, self.out_blocks, strict=True):
            if not paths or mul_out == 0:
                outs.append(x.new_zeros(x.shape[0], mul_out * ir_dim))
                continue
            # [nodes, sum of input muls, dim] x [sum of input muls, mul_out]: one matmul
            ws = [views[k] * alpha for k, _, alpha in paths]
            w = ws[0] if len(ws) == 1 else torch.cat(ws, 0)
            if self.ir_mul_input:  # blocks [nodes, dim, mul]: rows (node, component) of one mm
                xs = [blocks[i].view(x.shape[0], ir_dim, -1) for _, i, _ in paths]
                xs = xs[0] if len(xs) == 1 else torch.cat(xs, 2)
                out = dense_matmul(xs.reshape(-1, w.shape[0]), w).view(x.shape[0], ir_dim, mul_out)
                outs.append(out.transpose(1, 2).reshape(x.shape[0], -1))
                continue
            xs = [blocks[i].reshape(x.shape[0], -1, ir_dim) for _, i, _ in paths]
            xs = xs[0] if len(xs) == 1 else torch.cat(xs, 1)
            outs.append(torch.einsum("zui,uw->zwi", xs, w).reshape(x.shape[0], -1))
        out = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
        return out.reshape(*rows, self.out_dim)

def fuse_linears(model: torch.nn.Module) -> int:
    """Swap FusedLinear in for every interaction block's message `linear` that is an e3nn Linear
    with internal shared weights and no biases, in place; returns how many are fused."""
    return swap_in(_interaction_blocks(model), "linear", FusedLinear, _fusable)


def hand_messages_over(model: torch.nn.Module) -> int:
    """Where a block of HAND_OVER_BLOCKS holds a fused conv and a FusedLinear, the conv gives the
    linear its message in ir_mul (in place); returns how many blocks hand over."""
    handed = 0
    for block in _interaction_blocks(model):
        conv, linear = block.conv_tp, getattr(block, "linear", None)
        if (type(block).__name__ in HAND_OVER_BLOCKS and isinstance(conv, FusedChannelwiseConv)
                and isinstance(linear, FusedLinear) and linear.irreps_in == conv.irreps_out):
            conv.hand_ir_mul_to(linear)
            handed += 1
    return handed


def unfuse_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Put e3nn's Linears back (the inverse of `fuse_linears`), in place; a fused conv that
    handed its message to one gives it in mul_ir again."""
    blocks = _interaction_blocks(model)
    for block in blocks:
        conv = block.conv_tp
        if isinstance(conv, FusedChannelwiseConv) and conv._linear is not None:
            conv.hand_ir_mul_to(None)
    swap_out(blocks, "linear", FusedLinear)
    return model
