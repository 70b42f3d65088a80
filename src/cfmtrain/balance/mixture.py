"""Graph sizes (atoms) drawn from the paper's Table 3 mixture, for benchmarks and tests.

Assumption (the paper gives only ranges): atoms uniform within each subset's range, except MPtrj,
skewed small: a log-normal with median 24 atoms and sigma 0.75 clipped to 1-444 (mean about 32,
close to MPtrj's real mean of about 31 atoms per structure).
"""

from __future__ import annotations

import numpy as np

from cfmtrain.paper import TABLE3, TABLE3_GRAPHS

# Table 3's rows in the order of the draws: by the paper's name (the random streams follow it)
ROWS = tuple(sorted(TABLE3, key=lambda row: row.name))


def subset_counts(num_graphs: int) -> dict[str, int]:
    """Graphs per subset (by the paper's name) for a mixture of `num_graphs`, Table 3 shares,
    largest remainders."""
    shares = np.array([row.graphs for row in ROWS], float) / TABLE3_GRAPHS
    exact = shares * num_graphs
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(-(exact - counts), kind="stable")[: num_graphs - counts.sum()]] += 1
    return dict(zip((row.name for row in ROWS), counts.tolist(), strict=True))


def mixture_sizes(num_graphs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(atoms per graph, subset id per graph) in a random order; ids index `ROWS`."""
    rng = np.random.default_rng(seed)
    atoms, subsets = [], []
    for sid, (row, count) in enumerate(zip(ROWS, subset_counts(num_graphs).values(),
                                           strict=True)):
        lo, hi = row.atoms
        if row.key == "mptrj":
            drawn = np.rint(rng.lognormal(np.log(24.0), 0.75, count))
            part = np.clip(drawn, lo, hi).astype(np.int64)
        else:
            part = rng.integers(lo, hi + 1, count, dtype=np.int64)
        atoms.append(part)
        subsets.append(np.full(count, sid, np.int64))
    perm = rng.permutation(num_graphs)
    return np.concatenate(atoms)[perm], np.concatenate(subsets)[perm]
