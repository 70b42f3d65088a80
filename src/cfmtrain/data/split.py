"""`cfmtrain split`: the seeded train/valid/test split of a graph store, shared by every stage.

Stratified by subset so that every subset appears in each part in proportion; written as .npz.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from cfmtrain.atomic import atomic_path

PARTS = ("train", "valid", "test")


def split_indices(subsets: np.ndarray, fractions: tuple[float, float], seed: int
                  ) -> dict[str, np.ndarray]:
    """Per subset, shuffle with `seed` and cut off `fractions` = (valid, test); sorted indices.
    A subset of one graph goes to train; valid and test get at least one graph of a subset
    that has at least three."""
    valid_frac, test_frac = fractions
    if valid_frac < 0 or test_frac < 0 or valid_frac + test_frac >= 1:
        raise ValueError(f"split fractions valid={valid_frac}, test={test_frac} must be >= 0 "
                         "and sum to less than 1")
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {p: [] for p in PARTS}
    for subset in np.unique(subsets):
        members = rng.permutation(np.flatnonzero(subsets == subset))
        n = len(members)
        n_valid = max(int(round(valid_frac * n)), 1 if n >= 3 and valid_frac > 0 else 0)
        n_test = max(int(round(test_frac * n)), 1 if n >= 3 and test_frac > 0 else 0)
        parts["valid"].append(members[:n_valid])
        parts["test"].append(members[n_valid:n_valid + n_test])
        parts["train"].append(members[n_valid + n_test:])
    return {p: np.sort(np.concatenate(v)).astype(np.int64) if v else np.zeros(0, np.int64)
            for p, v in parts.items()}


def load_split(path: str | Path) -> dict[str, np.ndarray]:
    """The split written by `cfmtrain split`: index arrays 'train', 'valid', 'test'."""
    with np.load(path) as data:
        return {p: data[p] for p in PARTS}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain split`."""
    parser.add_argument("--graphs", type=Path, nargs="+", required=True,
                        help="graph store folder(s); several make a union")
    parser.add_argument("--output", type=Path, required=True, help="split .npz to write")
    parser.add_argument("--valid", type=float, default=0.1, help="validation fraction")
    parser.add_argument("--test", type=float, default=0.1, help="test fraction")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    """Write the split of the store's graphs."""
    from cfmtrain.graphs.store import GraphStore

    store = GraphStore(args.graphs)
    parts = split_indices(store.subsets, (args.valid, args.test), args.seed)
    with atomic_path(args.output) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, seed=args.seed, **parts)
    print(", ".join(f"{p}: {len(v)}" for p, v in parts.items()))
    return 0
