"""MACE's self-connection `skip_tp` (e3nn's fully connected tensor product of the node features
with the one-hot element attributes) as one small matmul per element present.

With N elements, e3nn forms the outer product of every node's features with its N attributes
and contracts it with all N weight matrices ([nodes, mul x N] @ [mul x N, mul]: 89x the
arithmetic for a foundation model's 89 elements, in the forward and every backward). The
attributes are one-hot, so each node needs only its own element's matrix: nodes are grouped by
element and each group is multiplied by that element's weights. Same function, same parameters;
attributes that are not one-hot (or that need a gradient) go through e3nn's module.
"""

from __future__ import annotations

from math import sqrt

import torch
from e3nn import o3

from cfmtrain.kernels.adopt import Adopting, swap_in, swap_out
from cfmtrain.kernels.conv import _interaction_blocks


def _fusable(tp: torch.nn.Module) -> bool:
    """An e3nn TensorProduct with internal shared weights, scalar second input (the one-hot
    attributes) and weighted 'uvw' paths only."""
    if not isinstance(tp, o3.TensorProduct) or not (tp.internal_weights and tp.shared_weights):
        return False
    scalar_attrs = len(tp.irreps_in2) == 1 and tp.irreps_in2[0].ir == o3.Irrep("0e")
    return scalar_attrs and all(ins.connection_mode == "uvw" and ins.has_weight
                                for ins in tp.instructions)


def _one_hot(attrs: torch.Tensor) -> bool:
    return bool(((attrs == 0) | (attrs == 1)).all()) and bool((attrs.sum(1) == 1).all())


class FusedSkipTP(Adopting):
    """Drop-in `skip_tp` (node features, one-hot attributes) -> features; it adopts the
    TensorProduct's parameters and buffers under the same names (state_dict unchanged), and
    `restore()` gives the TensorProduct back."""

    def __init__(self, tp: o3.TensorProduct) -> None:
        if not _fusable(tp):
            raise TypeError(f"FusedSkipTP: need internal shared 'uvw' weights and scalar "
                            f"attributes, got {tp}")
        super().__init__(tp)
        self.irreps_in1, self.irreps_out = tp.irreps_in1, tp.irreps_out
        # per path: input block, output block, constant (e3nn's path weight and 1/sqrt(dim))
        self.paths = [(ins.i_in1, ins.i_out,
                       ins.path_weight / sqrt(tp.irreps_out[ins.i_out].ir.dim))
                      for ins in tp.instructions]

    def forward(self, x: torch.Tensor, attrs: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # the grouping below depends on the data
            return self._original(x, attrs)
        if attrs.requires_grad or not _one_hot(attrs):
            return self.restore()(x, attrs)
        element = attrs.argmax(1)
        order = torch.argsort(element, stable=True)
        counts = torch.bincount(element, minlength=attrs.shape[1]).tolist()
        groups = [(v, c) for v, c in enumerate(counts) if c]
        xs = x.index_select(0, order)
        blocks: list[torch.Tensor | None] = [None] * len(self.irreps_out)
        views = self._original.weight_views(self.weight)
        for (i_in, i_out, alpha), w in zip(self.paths, views, strict=True):
            mul, ir = self.irreps_in1[i_in]
            start = self.irreps_in1[:i_in].dim
            xi = xs[:, start:start + mul * ir.dim].reshape(-1, mul, ir.dim)
            parts, first = [], 0
            for v, count in groups:  # [count, mul, dim] x [mul, mul_out] -> [count, mul_out, dim]
                parts.append(torch.einsum("zui,uw->zwi", xi[first:first + count], w[:, v, :]))
                first += count
            out = (torch.cat(parts) * alpha).reshape(x.shape[0], -1)
            blocks[i_out] = out if blocks[i_out] is None else blocks[i_out] + out
        full = [b if b is not None else x.new_zeros(x.shape[0], mul_ir.dim)
                for b, mul_ir in zip(blocks, self.irreps_out, strict=True)]
        result = torch.cat(full, dim=1) if len(full) > 1 else full[0]
        return result.index_select(0, order.argsort())

def fuse_skips(model: torch.nn.Module) -> int:
    """Swap FusedSkipTP into every interaction block whose `skip_tp` is e3nn's fully connected
    tensor product with the element attributes, in place; returns how many are fused."""
    return swap_in(_interaction_blocks(model), "skip_tp", FusedSkipTP, _fusable)


def unfuse_skips(model: torch.nn.Module) -> torch.nn.Module:
    """Put e3nn's TensorProducts back (the inverse of `fuse_skips`), in place."""
    swap_out(_interaction_blocks(model), "skip_tp", FusedSkipTP)
    return model
