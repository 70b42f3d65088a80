"""A pure-PyTorch evaluator of sparse polynomials (kernels/sparse_polynomial.py).

It computes what the compiled `cfmtrain::sparse_polynomial` op computes, from the same packed
descriptor, with torch ops only: it runs on any device and dtype, autograd gives every order of
derivative, and it checks the descriptor format independently of the C++ kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import torch

from cfmtrain.kernels.sparse_polynomial import Descriptor


class _Group(NamedTuple):
    """The terms with one number of factors k: (T_k, k) components, (T_k,) outputs and coeffs."""

    comps: torch.Tensor  # into the operands concatenated along the component axis
    out: torch.Tensor
    coeff: torch.Tensor


@functools.lru_cache(maxsize=256)
def _groups(desc: Descriptor, device: torch.device) -> tuple[_Group, ...]:
    """The descriptor's terms grouped by factor count, as index tensors on `device`."""
    offsets = torch.tensor((0, *desc.operand_dims), dtype=torch.int64).cumsum(0)
    comps = offsets[desc.factor_op] + desc.factor_comp
    counts = desc.factor_ptr.diff()
    groups = []
    for k in counts.unique().tolist():
        terms = (counts == k).nonzero().squeeze(1)
        positions = desc.factor_ptr[terms, None] + torch.arange(k)
        groups.append(_Group(comps[positions].to(device), desc.term_out[terms].to(device),
                             desc.term_coeff[terms].to(device)))
    return tuple(groups)


def evaluate_reference(desc: Descriptor, operands: Sequence[torch.Tensor],
                       elem: torch.Tensor | None, num_rows: int,
                       num_elems: int = 0) -> torch.Tensor:
    """Evaluate `desc` like `sparse_polynomial.evaluate`: (rows_out, num_out, C).

    `operands` are (rows, dim, C), rows being num_rows, or num_elems for per-element operands
    (row `elem[node]` for node `node`); the output rows are nodes, or elements when
    `desc.out_per_elem` (summed over each element's nodes).
    """
    if len(operands) != len(desc.operand_dims):
        raise ValueError(f"descriptor takes {len(desc.operand_dims)} operands, got {len(operands)}")
    if elem is None and (desc.out_per_elem or any(desc.operand_per_elem)):
        raise ValueError("`elem` is required with per-element operands or output")
    first = operands[0]
    channels = first.shape[2]
    by_node = [x.index_select(0, elem) if per_elem else x
               for x, per_elem in zip(operands, desc.operand_per_elem, strict=True)]
    for x, dim in zip(by_node, desc.operand_dims, strict=True):
        if x.shape != (num_rows, dim, channels):
            raise ValueError(f"operand of shape {tuple(x.shape)} per node, expected "
                             f"{(num_rows, dim, channels)}")
    table = torch.cat(by_node, dim=1)  # (num_rows, sum of dims, C)
    out = first.new_zeros((num_rows, desc.num_out, channels))
    for group in _groups(desc, first.device):
        product = table.index_select(1, group.comps[:, 0])
        for f in range(1, group.comps.shape[1]):
            product = product * table.index_select(1, group.comps[:, f])
        product = product * group.coeff.to(first.dtype)[:, None]
        out = out.index_add(1, group.out, product)
    if desc.out_per_elem:
        out = first.new_zeros((num_elems, desc.num_out, channels)).index_add(0, elem, out)
    return out
