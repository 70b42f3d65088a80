"""The paper's Algorithm 1 in plain Python, line by line as our reading of its pseudocode goes.

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
    return [b for bins in algorithm1_rounds(sizes, capacity, num_ranks, order) for b in bins]


def algorithm1_rounds(sizes: Sequence, capacity: float, num_ranks: int,
                      order: Sequence[int] | None = None) -> list[list[list[int]]]:
    """Algorithm 1 round by round: for each round, its non-empty bins (see algorithm1_reference)."""
    sizes = plain_sizes(sizes, capacity)
    if order is None:
        order = sorted(range(len(sizes)), key=lambda g: -sizes[g])  # sorted() is stable
    remaining = [int(g) for g in order]
    rounds: list[list[list[int]]] = []
    while remaining:
        total = 0
        for g in remaining:
            total += sizes[g]
        bins, p = _round(sizes, remaining, capacity, _bins_needed(total, capacity, num_ranks))
        remaining = remaining[p:]
        rounds.append([b for b in bins if b])
    return rounds


def plain_sizes(sizes: Sequence, capacity: float) -> list:
    """Sizes as Python numbers, each checked to lie in [0, capacity]."""
    sizes = [s.item() if hasattr(s, "item") else s for s in sizes]
    for g, s in enumerate(sizes):
        if not 0 <= s <= capacity:  # the pseudocode would loop forever on a graph above C
            raise ValueError(f"graph {g} has size {s}, outside [0, capacity {capacity}]")
    return sizes


def _round(sizes: list, remaining: list[int], capacity: float,
           num_bins: int) -> tuple[list[list[int]], int]:
    """One round over `remaining`: its bins and how many graphs it placed (a prefix)."""
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
    return bins, p
