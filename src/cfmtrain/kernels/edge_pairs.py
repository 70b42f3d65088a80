"""Each edge and its reverse: the radial MLP runs once per pair of edges.

A radius graph holds every bond twice, s -> r with vector v and r -> s with -v (the periodic
image with the opposite shift). MACE's radial MLP sees only the edge's radial features, a
function of |v| (and of both ends' elements, symmetrically), so both edges get the same weights:
the MLP needs to run on one edge of each pair (half the rows), its output gathered back to all.

Pairs are found from the block's inputs, never assumed: an edge's reverse has the opposite ends,
spherical harmonics' l = 1 columns negated (Y(-v) = -Y(v): the direction, so the periodic
image is the right one) and the same radial features. Both are compared to a few units of the
last place, not bit for bit: the neighbour list's shifts (a BLAS product per edge) can round the
two edges' vectors differently. Any edge failing a check keeps its own row, so the result is
right for any graph (a directed one simply gains nothing). The pairing is structural, not a
coincidence of values: both edges' features are one function of the positions (and of a
strain), so every derivative (forces, stress, a force-trained step) is the same function's.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from e3nn import o3


class EdgePairs(NamedTuple):
    """`rep` [U]: one edge of each pair (and every unpaired edge); `inverse` [E]: each edge's
    row among them, so that rows_of_rep[inverse] gives every edge its pair's rows."""

    rep: torch.Tensor
    inverse: torch.Tensor


def _direction(irreps: o3.Irreps) -> slice | None:
    """The columns of the harmonics' first odd irrep (l = 1: the edge's direction, odd under
    v -> -v), or None."""
    offset = 0
    for mul, ir in irreps:
        if ir.p < 0:
            return slice(offset, offset + ir.dim)
        offset += mul * ir.dim
    return None


# Directions (l = 1 harmonics, |y| <= sqrt(3)) are hashed on a grid of this step: far finer than
# the gap between two images of one bond, far coarser than rounding.
_GRID = 4096.0


def edge_pairs(edge_index: torch.Tensor, edge_attrs: torch.Tensor, edge_feats: torch.Tensor,
               attrs_irreps: o3.Irreps) -> EdgePairs | None:
    """Pair each edge of `edge_index` [2, E] (sender, receiver) with its reverse, given the
    edges' spherical harmonics [E, attrs_irreps.dim] and radial features [E, F] (see the
    module's docstring); None when no edge pairs or the harmonics have no odd-l irrep."""
    direction = _direction(attrs_irreps)
    num_edges = edge_index.shape[1]
    if num_edges < 2 or direction is None or attrs_irreps.dim != edge_attrs.shape[1]:
        return None
    sender, receiver = edge_index[0].to(torch.int64), edge_index[1].to(torch.int64)
    num_nodes = int(torch.maximum(sender.max(), receiver.max())) + 1
    ends, reverse_ends = sender * num_nodes + receiver, receiver * num_nodes + sender
    y = edge_attrs[:, direction]
    # A key both edges of a pair share: their unordered ends and their direction taken from the
    # lower end (for a self-image, the direction whose first non-zero component is positive).
    grid = torch.round(y * _GRID).to(torch.int64)
    first = grid.gather(1, (grid != 0).to(torch.int8).argmax(1, keepdim=True)).squeeze(1)
    flip = (sender > receiver) | ((sender == receiver) & (first < 0))
    key = torch.minimum(ends, reverse_ends)
    for column in torch.where(flip.unsqueeze(1), -grid, grid).unbind(1):
        key = key * 1_000_033 + column  # wraps around: a hash, each pair checked below
    order = torch.argsort(key)
    k = key.index_select(0, order)
    same = k[1:] == k[:-1]
    # runs of exactly two equal keys: position i starts one
    starts = same.clone()
    starts[1:] &= ~same[:-1]
    starts[:-1] &= ~same[1:]
    i = starts.nonzero().flatten()
    a, b = order.index_select(0, i), order.index_select(0, i + 1)
    # each candidate pair: opposite ends, opposite directions and the same radial features, to
    # 64 units of the last place of the row's largest value
    signature = torch.cat([y, edge_feats], 1)
    reverse_signature = torch.cat([-y, edge_feats], 1)
    sa = signature.index_select(0, a)
    gap = (sa - reverse_signature.index_select(0, b)).abs().amax(1)
    tol = 64 * torch.finfo(signature.dtype).eps
    ok = (ends.index_select(0, a) == reverse_ends.index_select(0, b)) & (
        gap <= tol * sa.abs().amax(1).clamp_min(1.0))
    a, b = a[ok], b[ok]
    if a.numel() == 0:
        return None
    # the lower-numbered edge of each pair represents it
    lo, hi = torch.minimum(a, b), torch.maximum(a, b)
    keep = torch.ones(num_edges, dtype=torch.bool, device=edge_index.device)
    keep[hi] = False
    rep = keep.nonzero().flatten()
    slot = torch.cumsum(keep, 0) - 1
    inverse = slot.clone()
    inverse[hi] = slot[lo]
    return EdgePairs(rep, inverse)
