"""Graph sizes (atoms) drawn from the paper's Table 3 mixture, for benchmarks and tests.

Assumption (the paper gives only ranges): atoms uniform within each subset's range, except MPtrj,
skewed small: a log-normal with median 24 atoms and sigma 0.75 clipped to 1-444 (mean about 32,
close to MPtrj's real mean of about 31 atoms per structure).
"""

from __future__ import annotations

import numpy as np

# subset: (graphs in the paper's Table 3, smallest, largest atom count)
TABLE3: dict[str, tuple[int, int, int]] = {
    "Al-HCl(aq)": (884, 281, 281),
    "CuNi": (74_335, 492, 500),
    "HEA": (25_628, 36, 48),
    "Liquid water": (190_267, 768, 768),
    "MPtrj": (1_580_312, 1, 444),
    "TMD": (219_627, 16, 96),
    "Water clusters": (460_000, 9, 75),
    "Zeolite": (99_770, 203, 408),
}
PAPER_GRAPHS = sum(count for count, _, _ in TABLE3.values())  # 2,650,823


def subset_counts(num_graphs: int) -> dict[str, int]:
    """Graphs per subset for a mixture of `num_graphs`, Table 3 shares, largest remainders."""
    shares = np.array([c for c, _, _ in TABLE3.values()], float) / PAPER_GRAPHS
    exact = shares * num_graphs
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(-(exact - counts), kind="stable")[: num_graphs - counts.sum()]] += 1
    return dict(zip(TABLE3, counts.tolist(), strict=True))


def mixture_sizes(num_graphs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(atoms per graph, subset id per graph) in a random order; ids index `list(TABLE3)`."""
    rng = np.random.default_rng(seed)
    atoms, subsets = [], []
    for sid, (name, count) in enumerate(subset_counts(num_graphs).items()):
        _, lo, hi = TABLE3[name]
        if name == "MPtrj":
            drawn = np.rint(rng.lognormal(np.log(24.0), 0.75, count))
            part = np.clip(drawn, lo, hi).astype(np.int64)
        else:
            part = rng.integers(lo, hi + 1, count, dtype=np.int64)
        atoms.append(part)
        subsets.append(np.full(count, sid, np.int64))
    perm = rng.permutation(num_graphs)
    return np.concatenate(atoms)[perm], np.concatenate(subsets)[perm]
