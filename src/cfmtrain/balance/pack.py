"""`pack_bins`: the paper's Algorithm 1 (compiled) turned into a plan of R bins per step.

After the algorithm, bins are made a multiple of R (empty bins only when there are fewer graphs
than bins) and ordered by load so that the R bins of a step carry near-equal loads.
`refine=True` (the default) adds our two refinements, not the paper's, each acting only when
Algorithm 1 misses a goal: above the lower bound + R bins, its leftovers are refilled
into the gaps of its first round (kernels/balance/refine.h); below a step balance of 0.999, the
uneven steps are dealt again by LPT within the capacity (kernels/balance/rebalance.h).

The packing runs compiled (`cfmtrain._balance`) wherever that is built. Without it, a training
on a device other than the CPU (a GPU node's install), or any with CFMTRAIN_NO_EXTENSION=1, packs
with balance/portable.py, which gives the same plans, said once (`packing_backend`); anything
else is refused by name.
"""

from __future__ import annotations

import os
import warnings
from typing import Literal

import numpy as np

from cfmtrain.balance import portable
from cfmtrain.balance.plan import Plan

NO_EXTENSION = "CFMTRAIN_NO_EXTENSION"  # =1: an install without the compiled extension
_balance = None
if os.environ.get(NO_EXTENSION) != "1":  # (one built in a shared checkout is another host's)
    try:
        from cfmtrain import _balance
    except ImportError:  # an install without the compiled extension
        pass

COMPILED, PORTABLE = "compiled", "portable"
_use_portable = False  # set once a training on a device other than the CPU asked for it

Oversize = Literal["error", "own_bin"]
OVERSIZE_FILL = 0.85  # a large graph's step is built only if its partner bins reach this share


def as_sizes(sizes, name: str = "sizes") -> np.ndarray:
    """`sizes` as 1-D int64 (integers) or float64 (real costs); rejects NaN and negatives."""
    arr = np.asarray(sizes)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.dtype.kind in "biu":
        arr = arr.astype(np.int64, copy=False)
    elif arr.dtype.kind == "f":
        arr = arr.astype(np.float64, copy=False)
        bad = np.flatnonzero(~np.isfinite(arr))
        if len(bad):
            raise ValueError(f"{name}: graph {bad[0]} has size {arr[bad[0]]} (not finite)")
    else:
        raise ValueError(f"{name} must hold numbers, got dtype {arr.dtype}")
    bad = np.flatnonzero(arr < 0)
    if len(bad):
        raise ValueError(f"{name}: graph {bad[0]} has negative size {arr[bad[0]]}")
    return arr


def packing_backend(device=None) -> str:
    """How this process packs for a training on `device`: "compiled" where cfmtrain._balance is
    built; else, for a device other than the CPU or anywhere with CFMTRAIN_NO_EXTENSION=1 (an
    install made without it on purpose), "portable" (balance/portable.py, the same plans; said
    once, and used by this process from then on); a CPU run that expected it is refused
    (ImportError)."""
    global _use_portable
    if _balance is not None:
        return COMPILED
    cpu = str(device or "cpu").split(":")[0] == "cpu"  # a torch.device or its name (no torch)
    if cpu and os.environ.get(NO_EXTENSION) != "1":
        raise ImportError(_NOT_BUILT)
    if not _use_portable:
        _use_portable = True
        warnings.warn("cfmtrain._balance is not built: Algorithm 1 runs in Python "
                      "(cfmtrain.balance.portable, the same plans, 1-2 s per million "
                      "graphs and pass)", stacklevel=2)
    return PORTABLE


_NOT_BUILT = ("cfmtrain._balance is not built (Algorithm 1): run `python setup.py build_ext "
              "--inplace` in the repository (or reinstall cfmtrain without "
              "CFMTRAIN_NO_EXTENSION); a training on a CUDA device packs in Python instead")


def _module():
    """The module the packing functions come from (see `packing_backend`)."""
    if _balance is not None:
        return _balance
    if _use_portable:
        return portable
    raise ImportError(_NOT_BUILT)


def kernel(name: str, sizes: np.ndarray, capacity: float):
    """The compiled function (or its portable twin) for the sizes' type, with the capacity
    cast to match."""
    if sizes.dtype == np.int64 and float(capacity).is_integer():
        return getattr(_module(), f"{name}_i64"), sizes, int(capacity)
    return getattr(_module(), f"{name}_f64"), sizes.astype(np.float64), float(capacity)


def descending_order(sizes: np.ndarray, candidates: np.ndarray | None = None,
                     rng: np.random.Generator | None = None) -> np.ndarray:
    """Order of `candidates` (default all) by size, descending: stable, or with `rng` each run of
    equal sizes shuffled (ties at random, sizes still non-increasing)."""
    candidates = np.arange(len(sizes)) if candidates is None else np.asarray(candidates, np.int64)
    seed = -1 if rng is None else int(rng.integers(1 << 62))
    fn, sizes, _ = kernel("order_descending", sizes, 1)
    return fn(sizes, candidates, seed)


def check_oversize(sizes: np.ndarray, capacity: float, oversize: Oversize) -> np.ndarray:
    """Indices of graphs above `capacity`; a ValueError naming the first unless 'own_bin'."""
    if oversize not in ("error", "own_bin"):
        raise ValueError(f"oversize must be 'error' or 'own_bin', got {oversize!r}")
    if not capacity > 0:
        raise ValueError(f"capacity must be positive, got {capacity}")
    big = np.flatnonzero(sizes > capacity)
    if len(big) and oversize == "error":
        raise ValueError(
            f"graph {big[0]} has size {sizes[big[0]]}, above the bin capacity {capacity} "
            f"({len(big)} graph(s) above it); raise the capacity or pass oversize='own_bin'")
    return big


def pack_plan(sizes, capacity: float, num_ranks: int, *, oversize: Oversize = "error",
              rng: np.random.Generator | None = None, refine: bool = True) -> Plan:
    """Algorithm 1 as a Plan; `rng` breaks ties among equal sizes at random (else stable);
    `refine` adds our refinements (see the module docstring; False: Algorithm 1 alone)."""
    sizes = as_sizes(sizes)
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be at least 1, got {num_ranks}")
    big = check_oversize(sizes, capacity, oversize)
    candidates = None
    if len(big):
        candidates = np.flatnonzero(sizes <= capacity)
    order = descending_order(sizes, candidates, rng)
    if not len(big):
        fn, typed, cap = kernel("pack", sizes, capacity)
        return Plan(*fn(typed, order, cap, num_ranks, refine), num_ranks)
    fn, typed, cap = kernel("algorithm1", sizes, capacity)
    flat, offsets = fn(typed, order, cap, num_ranks, refine)
    head, flat, offsets, big = oversize_steps(sizes, big, flat, offsets, num_ranks, rng)
    flat = np.concatenate([flat, big])  # each oversize graph left alone in a bin of its own
    offsets = np.concatenate([offsets, offsets[-1] + np.arange(1, len(big) + 1)])
    plan = finalize(flat, offsets, sizes, num_ranks)
    plan = rebalance(plan, sizes, capacity) if refine else plan
    if head is None:
        return plan
    return Plan(  # the large graphs' steps first, then the rest
        np.concatenate([head.flat, plan.flat]),
                np.concatenate([head.offsets, head.offsets[-1] + plan.offsets[1:]]), num_ranks)


def oversize_steps(sizes: np.ndarray, big: np.ndarray, flat: np.ndarray, offsets: np.ndarray,
                   num_ranks: int, rng: np.random.Generator | None
                   ) -> tuple[Plan | None, np.ndarray, np.ndarray, np.ndarray]:
    """A step for each graph above the capacity (largest first) whose other ranks get bins of
    the packed small graphs merged up to that graph's size (at least OVERSIZE_FILL of it): the step
    takes the time the graph alone takes, and the graph is trained beside the other kinds of
    structure instead of beside another large cell (steps of large cells alone slowed the
    energy's learning on mixed data). Bins are taken at random with `rng`, else the lightest
    first. The scan is compiled (`_balance.oversize_partners`), the rest vectorised: no loop
    over graphs or ranks here.

    Returns (the steps as a plan, or None; the bins left as CSR flat and offsets; the graphs
    left over)."""
    if num_ranks == 1 or not len(big):
        return None, flat, offsets, big
    packed = Plan(flat, offsets, 1)
    loads = packed.loads(sizes)
    pool = rng.permutation(len(loads)) if rng is not None else np.argsort(loads, kind="stable")
    order = big[np.argsort(-sizes[big], kind="stable")]
    scan, typed, _ = kernel("oversize_partners", sizes, 0)
    cumulative = np.cumsum(loads[pool]).astype(typed.dtype)
    placed, ends = scan(cumulative, typed[order], num_ranks, OVERSIZE_FILL)
    placed = placed.astype(bool)
    taken = int(ends[-1]) if len(ends) else 0
    rest = packed.reordered(np.sort(pool[taken:]))
    if not placed.any():
        return None, rest.flat, rest.offsets, order[~placed]
    # the partners' graphs, bin runs back to back in pool order, and each run's graph count
    merged = packed.reordered(pool[:taken])
    run_graphs = np.diff(merged.offsets[np.concatenate([[0], ends])])
    counts = np.column_stack([np.ones(placed.sum(), np.int64),
                              run_graphs.reshape(-1, num_ranks - 1)])
    starts = merged.offsets[np.concatenate([[0], ends[num_ranks - 2::num_ranks - 1][:-1]])]
    head_flat = np.insert(merged.flat, starts, order[placed])
    head = Plan(head_flat, np.concatenate([[0], np.cumsum(counts.ravel())]), num_ranks)
    return head, rest.flat, rest.offsets, order[~placed]


def pack_bins(sizes, capacity: float, num_ranks: int, *, oversize: Oversize = "error",
              refine: bool = True) -> list[np.ndarray]:
    """The paper's Algorithm 1: bins of graph indices, `bins[s*R:(s+1)*R]` being step s.

    Every graph appears exactly once; no bin exceeds `capacity` (except, with oversize='own_bin',
    a graph above it, alone, and the bins beside it in its step, up to its size: see
    `oversize_steps`; the default raises a ValueError naming it); the number of bins is a
    multiple of `num_ranks`; a bin is empty only when there are fewer graphs than bins.
    `refine=False` gives the paper's algorithm alone; the default adds our refinements, which act
    only when Algorithm 1 ends above the lower bound + R bins or below a step balance of 0.999.
    """
    return pack_plan(sizes, capacity, num_ranks, oversize=oversize, refine=refine).bins()


def finalize(flat: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, num_ranks: int) -> Plan:
    """Bins made a multiple of R, then ordered by load (heaviest first), empty bins last.

    Missing bins are filled by moving the last (smallest) graph of the heaviest bins holding two
    or more graphs; they stay empty only when every bin holds one graph.
    """
    fn, typed, _ = kernel("finalize", sizes, 1)
    flat, offsets = fn(typed, np.asarray(flat, np.int64), np.asarray(offsets, np.int64), num_ranks)
    return Plan(flat, offsets, num_ranks)


def rebalance(plan: Plan, sizes: np.ndarray, capacity: float) -> Plan:
    """Our step rebalancing: when the plan's step balance is below 0.999, each step below it is
    dealt again by LPT, kept if within `capacity` and its largest load drops."""
    fn, typed, cap = kernel("rebalance", sizes, capacity)
    return Plan(*fn(typed, plan.flat, plan.offsets, cap, plan.num_ranks), plan.num_ranks)
