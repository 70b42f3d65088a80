"""The training's part of `cfmtrain._balance` in Python: Algorithm 1, our two refinements, the
step formation, the descending order and the oversize partners, for an install without the
compiled extension (a GPU node; which one runs where: balance.pack).

Line by line the algorithms of kernels/balance/*.h, with the same data structures (Algorithm 1's
full bins in buckets by remaining capacity, the refill's union-find pool, the deal's heap) and
the same arithmetic in the same order: Python ints for integer sizes, Python floats (IEEE doubles)
for real ones, every sum taken left to right as the C++ loops take it. So the plans equal the
compiled ones graph for graph (tests/balance/test_portable_packer.py). One loop step per
graph: about a microsecond each, 1-2 s per million graphs and pass, where the compiled code
takes 0.02 s. Functions are named as the compiled ones (`<name>_i64`, `<name>_f64`); the peers'
packing loops (next fit, first fit, LPT groups) are compiled only.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field

import numpy as np

ATTEMPTS = 8  # the refill's thresholds t0, 2 t0, ..., 128 t0 (refine.h)
POLISH_ROUNDS = 4  # swaps per bin of a step, at most (rebalance.h)
STEP_TARGET = 0.999  # the goal for the plan's step balance
MASK = (1 << 64) - 1


# ------------------------------------------------------------------ inputs


def _list(array, kind: type, name: str) -> list:
    """A one-dimensional numpy-like input as a list of Python numbers of `kind`."""
    a = np.asarray(array)
    if a.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional")
    return a.astype(np.int64 if kind is int else np.float64).tolist()


def _check_indices(idx: list[int], num_sizes: int, name: str) -> None:
    if any(i < 0 or i >= num_sizes for i in idx):
        raise ValueError(f"{name} holds an index outside sizes")


def _sum(values) -> int | float:
    """Left to right, as a C++ loop adds (Python's sum() of floats compensates since 3.12)."""
    total = 0
    for v in values:
        total += v
    return total


def _ceil_div(total, capacity) -> int:
    """ceil(total / capacity), exact for integers."""
    if isinstance(total, int) and isinstance(capacity, int):
        return (total + capacity - 1) // capacity
    return int(math.ceil(total / capacity))


def bins_needed(total, capacity, num_ranks: int) -> int:
    """Bins of a round: max(R, ceil(total / C) rounded up to a multiple of R)."""
    multiple = (_ceil_div(total, capacity) + num_ranks - 1) // num_ranks
    return max(num_ranks, multiple * num_ranks)


def _visiting_sizes(size: list, order: list[int], capacity) -> list:
    """Sizes in visiting order, checked as the compiled code checks them."""
    ss = []
    for q, g in enumerate(order):
        if g < 0 or g >= len(size):
            raise ValueError("order holds an index outside sizes")
        s = size[g]
        if not s >= 0 or s > capacity:
            raise ValueError(f"graph {g} has size {s}, outside [0, capacity {capacity}]")
        if q > 0 and s > ss[-1]:
            raise ValueError("sizes must be non-increasing along order")
        ss.append(s)
    return ss


# ------------------------------------------------------------------ Algorithm 1 (algorithm1.h)


class _Round:
    """One round of Algorithm 1 over non-increasing sizes `ss`: the active bins kept sorted by
    remaining capacity, the full ones in buckets by capacity (lists linked through `link`)."""

    def __init__(self, ss: list, capacity, bins: int) -> None:
        self.ss, self.n = ss, len(ss)
        self.cap = [capacity] * bins
        self.active = list(range(bins))
        self.link = [-1] * bins
        self.full: dict = {}  # capacity -> [head, tail]
        self.keys: list = []  # the full buckets' capacities, ascending
        self.bin_of = [0] * self.n
        self.returned, self.p = False, 0
        self.next_active: list[int] = []

    def run(self) -> int:
        """Assigns a prefix of the graphs; returns its length (bin_of: each graph's bin)."""
        ss, cap = self.ss, self.cap
        while self.p < self.n and self.active:
            s, active = ss[self.p], self.active
            i = 0
            while i < len(active) and cap[active[i]] < s:
                i += 1
            self._mark_full(i)
            self.next_active = []
            if self.returned:
                self._walk_merged(i, s)
            else:
                for a in range(i, len(active)):
                    if self.p >= self.n:
                        break
                    self._give(active[a])
            self.active = self.next_active
            self.returned = (self.p < self.n and bool(self.keys) and bool(self.active)
                             and cap[self.active[0]] < self.keys[-1])
        return self.p

    def _mark_full(self, count: int) -> None:
        active, cap, link, full = self.active, self.cap, self.link, self.full
        for k in range(count):
            b = active[count - 1 - k if self.returned else k]
            key = cap[b]
            link[b] = -1
            bucket = full.get(key)
            if bucket is None:
                full[key] = [b, b]
                bisect.insort(self.keys, key)
            elif self.returned:
                link[b] = bucket[0]
                bucket[0] = b
            else:
                link[bucket[1]] = b
                bucket[1] = b

    def _walk_merged(self, a: int, s) -> None:
        active, cap, link, keys = self.active, self.cap, self.link, self.keys
        first = at = bisect.bisect_left(keys, s)
        f = self.full[keys[at]][0] if at < len(keys) else -1
        while self.p < self.n and (a < len(active) or f >= 0):
            if f < 0 or (a < len(active) and cap[active[a]] <= keys[at]):
                self._give(active[a])
                a += 1
            else:
                b, f = f, link[f]
                self._give(b)
                if f < 0:
                    at += 1
                    if at < len(keys):
                        f = self.full[keys[at]][0]
        for key in keys[first:]:  # all taken, or the round is over
            del self.full[key]
        del keys[first:]

    def _give(self, b: int) -> None:
        self.bin_of[self.p] = b
        self.cap[b] -= self.ss[self.p]
        self.p += 1
        self.next_active.append(b)


@dataclass
class Assignment:
    """Each graph's bin (in visiting order) among the emitted bins, their counts and loads."""

    bin_of: list[int]
    count: list[int] = field(default_factory=list)
    load: list = field(default_factory=list)
    first_round_graphs: int = 0
    first_round_bins: int = 0


def algorithm1_rounds(ss: list, capacity, num_ranks: int) -> Assignment:
    """The whole of Algorithm 1 over non-increasing sizes: rounds over the leftovers."""
    n = len(ss)
    out = Assignment([0] * n)
    done = 0
    while done < n:
        rest = ss[done:]
        bins = bins_needed(_sum(rest), capacity, num_ranks)
        rnd = _Round(rest, capacity, bins)
        p = rnd.run()
        emitted, load = [0] * bins, [0] * bins
        for q in range(p):
            b = rnd.bin_of[q]
            emitted[b] += 1
            load[b] += rest[q]
        for b in range(bins):  # number the non-empty bins
            if emitted[b]:
                out.count.append(emitted[b])
                out.load.append(load[b])
                emitted[b] = len(out.count) - 1
        for q in range(p):
            out.bin_of[done + q] = emitted[rnd.bin_of[q]]
        if done == 0:
            out.first_round_graphs, out.first_round_bins = p, len(out.count)
        done += p
    return out


# ------------------------------------------------------------------ the refill (refine.h)


class _Pool:
    """Positions q0..n-1 of non-increasing sizes: the largest available graph of size <= c by
    a union-find (item k <-> position n - k; 0 = none)."""

    def __init__(self, ss: list, q0: int) -> None:
        self.n, self.q0 = len(ss), q0
        self.negated = [-s for s in ss]  # non-decreasing, for bisect
        self.up = list(range(self.n - q0 + 1))

    def largest_within(self, c) -> int:
        first = bisect.bisect_left(self.negated, -c, self.q0, self.n)
        k = self._find(self.n - first)
        return -1 if k == 0 else self.n - k

    def take(self, q: int) -> None:
        self.up[self.n - q] = self.n - q - 1

    def available(self, q: int) -> bool:
        return self._find(self.n - q) == self.n - q

    def _find(self, k: int) -> int:
        up = self.up
        while up[k] != k:
            up[k] = up[up[k]]
            k = up[k]
        return k


def _numbered(ss: list, bin_of: list[int], max_bins: int) -> Assignment:
    """The non-empty bins numbered by bin id, with counts and loads."""
    used = [False] * max_bins
    for b in bin_of:
        used[b] = True
    number, out = [-1] * max_bins, Assignment([0] * len(bin_of))
    for b in range(max_bins):
        if used[b]:
            number[b] = len(out.count)
            out.count.append(0)
            out.load.append(0)
    for q, b in enumerate(bin_of):
        k = out.bin_of[q] = number[b]
        out.count[k] += 1
        out.load[k] += ss[q]
    return out


def _refill(ss: list, capacity, num_ranks: int, alg: Assignment, threshold) -> Assignment:
    """One attempt with threshold t: the first-round bins refilled from the pool, the rest
    packed anew."""
    n = len(ss)
    q0 = bisect.bisect_left([-s for s in ss], -threshold)  # first size <= threshold
    bins = alg.first_round_bins
    bin_of, load = [0] * n, [0] * bins
    for q in range(q0):
        b = bin_of[q] = alg.bin_of[q]
        load[b] += ss[q]
    pool = _Pool(ss, q0)
    for b in range(bins):
        room = capacity - load[b]
        while (q := pool.largest_within(room)) >= 0:
            if load[b] + ss[q] > capacity:  # a rounding step of real sizes: try smaller graphs
                room = math.nextafter(ss[q], -math.inf)
                continue
            pool.take(q)
            bin_of[q] = b
            load[b] += ss[q]
            room = capacity - load[b]
    rest = [q for q in range(q0, n) if pool.available(q)]
    again = algorithm1_rounds([ss[q] for q in rest], capacity, num_ranks)
    for k, q in enumerate(rest):
        bin_of[q] = bins + again.bin_of[k]
    return _numbered(ss, bin_of, bins + len(again.count))


def _round_up(bins: int, num_ranks: int) -> int:
    return (bins + num_ranks - 1) // num_ranks * num_ranks


def refine_leftovers(ss: list, capacity, num_ranks: int, alg: Assignment) -> Assignment:
    """Algorithm 1's assignment, or the refilled one when that has fewer steps."""
    steps_alg = _round_up(len(alg.count), num_ranks)
    if alg.first_round_graphs == len(ss):
        return alg
    bound = bins_needed(_sum(ss), capacity, num_ranks)
    best, best_bins = None, steps_alg
    t = ss[alg.first_round_graphs]
    for _ in range(ATTEMPTS):
        if not best_bins > bound + num_ranks:
            break
        candidate = _refill(ss, capacity, num_ranks, alg, t)
        got = _round_up(len(candidate.count), num_ranks)
        if got < best_bins:
            best, best_bins = candidate, got
        if not t < ss[0]:  # every graph was pooled
            break
        t = t * 2
    return best if best_bins < steps_alg else alg


# ------------------------------------------------------------------ steps (rebalance.h)


def _polish(size: list, num_ranks: int, bins: list[list[int]], load: list) -> None:
    for _ in range(POLISH_ROUNDS * num_ranks):
        hi = load.index(max(load))  # the first of equal ones, as std::max_element
        lo = load.index(min(load))
        gap = load[hi] - load[lo]
        best_i, best_j, best = -1, -1, 0
        for i, g in enumerate(bins[hi]):
            for j in range(-1, len(bins[lo])):
                d = size[g] - (0 if j < 0 else size[bins[lo][j]])
                if not (d > 0 and d < gap):
                    continue
                miss = d + d - gap if d + d > gap else gap - d - d
                if best_i < 0 or miss < best:
                    best_i, best_j, best = i, j, miss
        if best_i < 0:
            return
        g = bins[hi][best_i]
        out, into = size[g], (0 if best_j < 0 else size[bins[lo][best_j]])
        if best_j < 0:
            del bins[hi][best_i]
        else:
            bins[hi][best_i] = bins[lo].pop(best_j)
        bins[lo].append(g)
        load[hi] = load[hi] - out + into
        load[lo] = load[lo] - into + out


def _deal_step(size: list, graphs: list[int], num_ranks: int, capacity
               ) -> list[list[int]] | None:
    """LPT (largest first, to the bin of least (load, graphs, number)), then polished; None if
    a graph would overflow the capacity."""
    heap = [(0, 0, b) for b in range(num_ranks)]
    bins: list[list[int]] = [[] for _ in range(num_ranks)]
    load = [0] * num_ranks
    for g in sorted(graphs, key=lambda g: -size[g]):  # stable
        low, count, b = heap[0]
        if low + size[g] > capacity:
            return None
        bins[b].append(g)
        load[b] = low + size[g]
        heapq.heapreplace(heap, (load[b], count + 1, b))
    _polish(size, num_ranks, bins, load)
    return bins


def _step_ratios(size: list, flat: list[int], offsets: list[int], steps: int, num_ranks: int,
                 bin_load: list | None) -> list[float]:
    ratios = [1.0] * steps
    for s in range(steps):
        top = total = 0
        for r in range(num_ranks):
            k = s * num_ranks + r
            load = bin_load[k] if bin_load is not None else _sum(
                size[g] for g in flat[offsets[k]:offsets[k + 1]])
            top = max(top, load)
            total += load
        if top > 0:
            ratios[s] = float(total) / num_ranks / float(top)
    return ratios


def rebalance_steps(size: list, flat: list[int], offsets: list[int], num_ranks: int, capacity,
                    bin_load: list | None = None) -> None:
    """Steps below the step-balance goal dealt again by LPT, in place, when the plan misses it."""
    bins = len(offsets) - 1
    steps = bins // num_ranks if num_ranks > 1 else 0
    ratios = _step_ratios(size, flat, offsets, steps, num_ranks, bin_load)
    if _sum(ratios) >= STEP_TARGET * float(steps):
        return
    for s in range(steps):
        if ratios[s] >= STEP_TARGET:
            continue
        first = s * num_ranks
        top = 0
        for r in range(num_ranks):
            top = max(top, _sum(size[g] for g in flat[offsets[first + r]:offsets[first + r + 1]]))
        dealt = _deal_step(size, flat[offsets[first]:offsets[first + num_ranks]], num_ranks,
                           capacity)
        if dealt is None:
            continue
        load = [_sum(size[g] for g in b) for b in dealt]
        if not max(load) < top:
            continue
        q = offsets[first]
        for k, r in enumerate(sorted(range(num_ranks), key=lambda r: -load[r])):  # stable
            flat[q:q + len(dealt[r])] = dealt[r]
            q += len(dealt[r])
            offsets[first + k + 1] = q


# ------------------------------------------------------------------ plans (pack_bins.cpp)


def _scatter(assignment: Assignment, order: list[int], bin_order: list[int]
             ) -> tuple[list[int], list[int]]:
    """Graphs scattered into the bins in `bin_order` (each bin's graphs in visiting order)."""
    start, offsets = [0] * len(assignment.count), [0]
    for b in bin_order:
        start[b] = offsets[-1]
        offsets.append(offsets[-1] + assignment.count[b])
    flat = [0] * len(assignment.bin_of)
    for q, b in enumerate(assignment.bin_of):
        flat[start[b]] = order[q]
        start[b] += 1
    return flat, offsets


def _finalize_bins(flat: list[int], offsets: list[int], load: list, size: list,
                   num_ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Bins made a multiple of R (the heaviest bins of two or more graphs give their last
    graph), then ordered by load, heaviest first (stable), empty bins last."""
    bins = len(load)
    start = offsets[:-1]
    count = [offsets[b + 1] - offsets[b] for b in range(bins)]
    load = list(load)
    need = (num_ranks - bins % num_ranks) % num_ranks
    while need > 0:
        donors = sorted((b for b in range(len(count)) if count[b] > 1), key=lambda b: -load[b])
        if not donors:
            break
        take = min(need, len(donors))
        for b in donors[:take]:
            count[b] -= 1
            moved = start[b] + count[b]
            load[b] -= size[flat[moved]]
            start.append(moved)
            count.append(1)
            load.append(size[flat[moved]])
        need -= take
    start += [0] * need
    count += [0] * need
    load += [0] * need
    order = sorted(range(len(count)), key=lambda b: (count[b] == 0, -load[b]))
    out, out_offsets = [], [0]
    for b in order:
        out += flat[start[b]:start[b] + count[b]]
        out_offsets.append(out_offsets[-1] + count[b])
    return np.asarray(out, np.int64), np.asarray(out_offsets, np.int64)


def _run_checked(sizes, order, capacity, num_ranks: int, refine: bool, kind: type
                 ) -> tuple[list, list[int], Assignment]:
    size, ordered = _list(sizes, kind, "sizes"), _list(order, int, "order")
    if not capacity > 0:
        raise ValueError("capacity must be positive")
    if num_ranks < 1:
        raise ValueError("num_ranks must be at least 1")
    capacity = kind(capacity)
    ss = _visiting_sizes(size, ordered, capacity)
    alg = algorithm1_rounds(ss, capacity, num_ranks)
    return size, ordered, refine_leftovers(ss, capacity, num_ranks, alg) if refine else alg


def _arrays(flat: list[int], offsets: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(flat, np.int64).reshape(-1), np.asarray(offsets, np.int64)


def _algorithm1(kind: type):
    def algorithm1(sizes, order, capacity, num_ranks: int, refine: bool = False):
        """Algorithm 1 over sizes[order] (non-increasing): (flat, offsets) of the non-empty
        bins; refine=True adds our refinement of the leftovers."""
        _, ordered, assignment = _run_checked(sizes, order, capacity, num_ranks, refine, kind)
        return _arrays(*_scatter(assignment, ordered, list(range(len(assignment.count)))))
    return algorithm1


def _pack(kind: type):
    def pack(sizes, order, capacity, num_ranks: int, refine: bool = False):
        """Algorithm 1 (refine: + our refinements), bins made a multiple of num_ranks and
        ordered by load: (flat, offsets)."""
        size, ordered, assignment = _run_checked(sizes, order, capacity, num_ranks, refine,
                                                 kind)
        capacity = kind(capacity)
        if len(assignment.count) % num_ranks:
            flat, offsets = _scatter(assignment, ordered, list(range(len(assignment.count))))
            flat, offsets = _finalize_bins(flat, offsets, assignment.load, size, num_ranks)
            if refine:
                return _rebalanced(size, flat.tolist(), offsets.tolist(), capacity, num_ranks)
            return flat, offsets
        bin_order = sorted(range(len(assignment.count)), key=lambda b: -assignment.load[b])
        flat, offsets = _scatter(assignment, ordered, bin_order)
        if refine:
            rebalance_steps(size, flat, offsets, num_ranks, capacity,
                            [assignment.load[b] for b in bin_order])
        return _arrays(flat, offsets)
    return pack


def _rebalanced(size: list, flat: list[int], offsets: list[int], capacity, num_ranks: int):
    rebalance_steps(size, flat, offsets, num_ranks, capacity)
    return _arrays(flat, offsets)


def _check_plan(size: list, flat: list[int], offsets: list[int]) -> None:
    bins = len(offsets) - 1
    if bins < 0 or offsets[0] != 0 or offsets[bins] != len(flat):
        raise ValueError("offsets must run from 0 to len(flat)")
    if any(offsets[b + 1] < offsets[b] for b in range(bins)):
        raise ValueError("offsets must not decrease")
    _check_indices(flat, len(size), "flat")


def _rebalance(kind: type):
    def rebalance(sizes, flat, offsets, capacity, num_ranks: int):
        """Our step rebalancing of any plan (flat, offsets): a new (flat, offsets)."""
        size, f, o = _list(sizes, kind, "sizes"), _list(flat, int, "flat"), _list(
            offsets, int, "offsets")
        if num_ranks < 1 or len(o) - 1 < 0 or (len(o) - 1) % num_ranks:
            raise ValueError("offsets must hold a multiple of num_ranks bins")
        _check_indices(f, len(size), "flat")
        if any(o[b + 1] < o[b] for b in range(len(o) - 1)):
            raise ValueError("offsets must not decrease")
        if o[0] != 0 or o[-1] != len(f):
            raise ValueError("offsets must run from 0 to len(flat)")
        return _rebalanced(size, f, o, kind(capacity), num_ranks)
    return rebalance


def _finalize(kind: type):
    def finalize(sizes, flat, offsets, num_ranks: int):
        """Bins made a multiple of num_ranks and ordered by load: (flat, offsets)."""
        size, f, o = _list(sizes, kind, "sizes"), _list(flat, int, "flat"), _list(
            offsets, int, "offsets")
        if num_ranks < 1:
            raise ValueError("num_ranks must be at least 1")
        _check_plan(size, f, o)
        load = [_sum(size[g] for g in f[o[b]:o[b + 1]]) for b in range(len(o) - 1)]
        return _finalize_bins(f, o, load, size, num_ranks)
    return finalize


# ------------------------------------------------------------------ the order (pack_bins.cpp)


class SplitMix64:
    """splitmix64 (kernels/balance/common.h): a seed gives the same draws as the compiled one."""

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, bound: int) -> int:
        """Uniform in [0, bound): Lemire's method with rejection."""
        m = self.next() * bound
        if m & MASK < bound:
            threshold = ((1 << 64) - bound) % bound
            while m & MASK < threshold:
                m = self.next() * bound
        return m >> 64


def _order_descending(kind: type):
    def order_descending(sizes, candidates, seed: int = -1) -> np.ndarray:
        """Order of candidates by size, descending: stable, or ties shuffled from seed >= 0."""
        values = np.asarray(_list(sizes, kind, "sizes"), np.int64 if kind is int else np.float64)
        cand = np.asarray(_list(candidates, int, "candidates"), np.int64)
        _check_indices(cand.tolist(), len(values), "candidates")
        out = cand[np.argsort(-values[cand], kind="stable")].tolist()
        if seed >= 0:
            rng, ordered = SplitMix64(seed), values[out].tolist()
            a, n = 0, len(out)
            while a < n:
                b = a + 1
                while b < n and ordered[b] == ordered[a]:
                    b += 1
                for k in range(b - a - 1, 0, -1):
                    j = a + rng.below(k + 1)
                    out[a + k], out[j] = out[j], out[a + k]
                a = b
        return np.asarray(out, np.int64)
    return order_descending


# ------------------------------------------------------------------ oversize (oversize.h)


def _oversize_partners(kind: type):
    def oversize_partners(cumulative, big_sizes, num_ranks: int, fill: float):
        """The partner bin runs of the oversize graphs' steps: (placed per graph, run ends)."""
        cum, size = _list(cumulative, kind, "cumulative"), _list(big_sizes, kind, "big_sizes")
        partners = num_ranks - 1
        if partners < 1:
            raise ValueError("oversize partners need num_ranks >= 2")
        placed, ends, taken = [], [], 0
        for s in size:
            end, run = taken, []
            while len(run) < partners:
                before = cum[end - 1] if end else 0
                stop = bisect.bisect_right(cum, before + s)
                if stop == end or float(cum[stop - 1] - before) < fill * s:
                    break
                run.append(stop)
                end = stop
            placed.append(len(run) == partners)
            if placed[-1]:
                ends += run
                taken = end
        return np.asarray(placed, bool), np.asarray(ends, np.int64)
    return oversize_partners


for _suffix, _kind in (("_i64", int), ("_f64", float)):
    for _name, _make in (("algorithm1", _algorithm1), ("pack", _pack), ("rebalance", _rebalance),
                         ("finalize", _finalize), ("order_descending", _order_descending),
                         ("oversize_partners", _oversize_partners)):
        globals()[_name + _suffix] = _make(_kind)
del _suffix, _kind, _name, _make

COMPILED_ONLY = ("next_fit", "first_fit", "lpt_groups")


def __getattr__(name: str):
    """The peers' loops, which only the compiled module holds: named in an ImportError."""
    if name.removesuffix("_i64").removesuffix("_f64") in COMPILED_ONLY:
        raise ImportError(f"cfmtrain._balance is not built: {name} (a peer's packing loop, "
                          "for the benchmarks) has no pure-Python version; build the extension "
                          "(`python setup.py build_ext --inplace`)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
