"""The paper's Algorithm 1 in plain Python, line by line as SPEC's pseudocode reads.

The reference the compiled `cfmtrain._balance.algorithm1_*` is tested against; slow (it re-sorts the
active bins every iteration), so only for tests and small inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _bins_needed(total: float, capacity: float, num_ranks: int) -> int:
    """max(R, ceil(ceil(total / C) / R) * R), exact for integers."""
    if isinstance(total, int) and isinstance(capacity, int):
        lower = -(-total // capacity)
    else:
        lower = math.ceil(total / capacity)
    return max(num_ranks, -(-lower // num_ranks) * num_ranks)


def algorithm1_reference(sizes: Sequence, capacity: float, num_ranks: int,
                         order: Sequence[int] | None = None) -> list[list[int]]:
    """Algorithm 1: the non-empty bins of each round, in bin order, graphs in assignment order.

    `order` defaults to the stable descending argsort of `sizes`; any order along which the sizes
    do not increase (e.g. with ties broken at random) is allowed. Bins are compared by remaining
    capacity: "max fill(active) > min fill(full)" is "min cap(active) < max cap(full)".
    """
    sizes = [s.item() if hasattr(s, "item") else s for s in sizes]
    for g, s in enumerate(sizes):
        if not 0 <= s <= capacity:  # the pseudocode would loop forever on a graph above C
            raise ValueError(f"graph {g} has size {s}, outside [0, capacity {capacity}]")
    if order is None:
        order = sorted(range(len(sizes)), key=lambda g: -sizes[g])  # sorted() is stable
    remaining = [int(g) for g in order]
    out: list[list[int]] = []
    while remaining:
        total = 0
        for g in remaining:
            total += sizes[g]
        num_bins = _bins_needed(total, capacity, num_ranks)
        cap = [capacity] * num_bins
        bins: list[list[int]] = [[] for _ in range(num_bins)]
        active, full, p = list(range(num_bins)), [], 0
        while p < len(remaining) and active:
            active = sorted(active, key=lambda b: cap[b])  # fullest first, stable
            newly_full = []
            for b in active:  # one walk over the active bins
                if p == len(remaining):
                    break
                g = remaining[p]
                if cap[b] >= sizes[g]:
                    bins[b].append(g)
                    cap[b] -= sizes[g]
                    p += 1
                else:
                    newly_full.append(b)  # the same graph is offered to the next bin
            marked = set(newly_full)
            active = [b for b in active if b not in marked]
            full += newly_full
            if full and active and min(cap[b] for b in active) < max(cap[b] for b in full):
                active += full
                full = []
        remaining = remaining[p:]
        out.extend(b for b in bins if b)
    return out
