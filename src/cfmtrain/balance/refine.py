"""Our refinement of Algorithm 1's leftovers (not in the paper) in plain Python: the reference the
compiled `refine=True` path (kernels/balance/refine.h, which explains the method) is tested against.
"""

from __future__ import annotations

from collections.abc import Sequence

from cfmtrain.balance.algorithm1 import _bins_needed, algorithm1_reference, algorithm1_rounds

ATTEMPTS = 8  # thresholds t0, 2 t0, ..., 128 t0


def _steps(bins: int, num_ranks: int) -> int:
    """Bins rounded up to a multiple of R (what the plan will hold)."""
    return -(-bins // num_ranks) * num_ranks


def _refill(sizes: list, order: list[int], first: list[list[int]], capacity: float,
            num_ranks: int, threshold: float) -> list[list[int]]:
    """The first-round bins keep their graphs above `threshold`, are refilled in order each with
    the largest pooled graph that fits (the earliest of equal ones); the rest packed anew."""
    pool = [g for g in order if sizes[g] <= threshold]  # visiting order: sizes non-increasing
    bins = []
    for kept in ([g for g in b if sizes[g] > threshold] for b in first):
        load = 0
        for g in kept:
            load += sizes[g]
        while True:
            fits = [k for k, g in enumerate(pool)
                    if sizes[g] <= capacity - load and load + sizes[g] <= capacity]
            if not fits:
                break
            g = pool.pop(fits[0])  # the first that fits is the largest, the earliest of equals
            kept.append(g)
            load += sizes[g]
        bins.append(kept)
    return [b for b in bins if b] + algorithm1_reference(sizes, capacity, num_ranks, order=pool)


def refine_reference(sizes: Sequence, capacity: float, num_ranks: int,
                     order: Sequence[int] | None = None) -> list[list[int]]:
    """Algorithm 1's bins, or refined ones when Algorithm 1 ends above the lower bound + R and the
    refinement gives fewer steps (same output as the compiled `algorithm1_*(..., refine=True)`)."""
    rounds = algorithm1_rounds(sizes, capacity, num_ranks, order)
    plain = [b for bins in rounds for b in bins]
    if len(rounds) <= 1:
        return plain
    sizes = [s.item() if hasattr(s, "item") else s for s in sizes]
    order = (sorted(range(len(sizes)), key=lambda g: -sizes[g]) if order is None
             else [int(g) for g in order])
    total = 0
    for g in order:
        total += sizes[g]
    bound = _bins_needed(total, capacity, num_ranks)
    best, best_steps = plain, _steps(len(plain), num_ranks)
    threshold = sizes[order[sum(len(b) for b in rounds[0])]]  # the largest leftover
    for _ in range(ATTEMPTS):
        if best_steps <= bound + num_ranks:
            break
        candidate = _refill(sizes, order, rounds[0], capacity, num_ranks, threshold)
        if _steps(len(candidate), num_ranks) < best_steps:
            best, best_steps = candidate, _steps(len(candidate), num_ranks)
        if not threshold < sizes[order[0]]:
            break
        threshold = threshold * 2
    return best


STEP_TARGET = 0.999  # the goal for the plan's step balance
POLISH_ROUNDS = 4  # swaps per bin of a step, at most


def _polish(sizes: list, bins: list[list[int]], loads: list) -> None:
    """Swaps (or moves) between the most and least loaded bins while one narrows their gap: the
    pair with size difference d (0 < d < gap) closest to gap / 2, the first in order."""
    for _ in range(POLISH_ROUNDS * len(bins)):
        hi = max(range(len(bins)), key=lambda b: (loads[b], -b))
        lo = min(range(len(bins)), key=lambda b: (loads[b], b))
        gap = loads[hi] - loads[lo]
        best = None
        for i, g in enumerate(bins[hi]):
            for j in range(-1, len(bins[lo])):
                d = sizes[g] - (0 if j < 0 else sizes[bins[lo][j]])
                if not 0 < d < gap:
                    continue
                miss = d + d - gap if d + d > gap else gap - d - d
                if best is None or miss < best[0]:
                    best = (miss, i, j)
        if best is None:
            return
        _, i, j = best
        g = bins[hi][i]
        out, into = sizes[g], (0 if j < 0 else sizes[bins[lo][j]])
        if j < 0:
            del bins[hi][i]
        else:
            bins[hi][i] = bins[lo].pop(j)
        bins[lo].append(g)
        loads[hi] = loads[hi] - out + into
        loads[lo] = loads[lo] - into + out


def _deal(sizes: list, graphs: list[int], num_ranks: int, capacity: float) -> list | None:
    """LPT: largest first (stable), each to the bin of least (load, graphs, number), then
    polished; None if one would overflow the capacity."""
    bins: list[list[int]] = [[] for _ in range(num_ranks)]
    loads = [0] * num_ranks
    for g in sorted(graphs, key=lambda g: -sizes[g]):
        b = min(range(num_ranks), key=lambda b: (loads[b], len(bins[b]), b))
        if loads[b] + sizes[g] > capacity:
            return None
        bins[b].append(g)
        loads[b] = loads[b] + sizes[g]
    _polish(sizes, bins, loads)
    return bins


def _load(sizes: list, graphs) -> float:
    total = 0
    for g in graphs:
        total += sizes[g]
    return total


def rebalance_reference(sizes: Sequence, bins: list, num_ranks: int, capacity: float,
                        target: float = STEP_TARGET) -> list[list[int]]:
    """Our step rebalancing (kernels/balance/rebalance.h): when the mean over steps of mean/max
    load is below `target`, each step below it is dealt again by LPT, kept if within capacity and
    its largest load drops, bins then heaviest first."""
    sizes = [s.item() if hasattr(s, "item") else s for s in sizes]
    steps = [[list(map(int, b)) for b in bins[k:k + num_ranks]]
             for k in range(0, len(bins), num_ranks)] if num_ranks > 1 else []
    ratios = []
    for step in steps:
        loads = [_load(sizes, b) for b in step]
        ratios.append(sum(loads) / num_ranks / max(loads) if max(loads) > 0 else 1.0)
    if sum(ratios) >= target * len(steps):
        return [list(map(int, b)) for b in bins]
    out = []
    for step, ratio in zip(steps, ratios, strict=True):
        top = max(_load(sizes, b) for b in step)
        dealt = _deal(sizes, [g for b in step for g in b], num_ranks, capacity) \
            if ratio < target else None
        if dealt is not None and max(_load(sizes, b) for b in dealt) < top:
            step = sorted(dealt, key=lambda b: -_load(sizes, b))  # stable
        out += step
    return out
