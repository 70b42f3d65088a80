"""`cfmtrain split`: the seeded train/valid/test split of a graph store, shared by every stage.

Stratified by subset (config_type) and, within each, by size (atoms), so that every subset
and size range appears in each part in proportion; written as .npz.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from cfmtrain.atomic import atomic_path

PARTS = ("train", "valid", "test")


def _spread(n: int, fraction: float, rng: np.random.Generator, at_least_one: bool
            ) -> np.ndarray:
    """Positions 0..n-1 (in size order) picked evenly for a part of `fraction` of n, with a
    random phase: systematic sampling, so each size range gives its share."""
    if n < 2 or fraction <= 0:
        return np.zeros(0, np.int64)
    phase = rng.random()
    picks = np.flatnonzero(np.diff(np.floor(phase + fraction * np.arange(n + 1))) > 0)
    if not len(picks) and at_least_one:
        picks = rng.integers(0, n, 1)
    return picks.astype(np.int64)


def split_indices(subsets: np.ndarray, fractions: tuple[float, float], seed: int,
                  sizes: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Seeded (valid, test) = `fractions` of each subset (config_type), spread over its graphs'
    `sizes` (atoms) so that rare large or small structures land in every part; sorted indices.
    A subset of one graph goes to train; valid and test get at least one graph of a subset
    that has at least three."""
    valid_frac, test_frac = fractions
    if valid_frac < 0 or test_frac < 0 or valid_frac + test_frac >= 1:
        raise ValueError(f"split fractions valid={valid_frac}, test={test_frac} must be >= 0 "
                         "and sum to less than 1")
    subsets = np.asarray(subsets)
    sizes = np.zeros(len(subsets)) if sizes is None else np.asarray(sizes)
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {p: [] for p in PARTS}
    for subset in np.unique(subsets):
        members = rng.permutation(np.flatnonzero(subsets == subset))
        members = members[np.argsort(sizes[members], kind="stable")]  # by size, random ties
        big_enough = len(members) >= 3
        valid = _spread(len(members), valid_frac, rng, big_enough)
        rest = np.delete(members, valid)
        test = _spread(len(rest), test_frac / (1 - valid_frac), rng, big_enough)
        parts["valid"].append(members[valid])
        parts["test"].append(rest[test])
        parts["train"].append(np.delete(rest, test))
    return {p: np.sort(np.concatenate(v)).astype(np.int64) if v else np.zeros(0, np.int64)
            for p, v in parts.items()}


def load_split(path: str | Path) -> dict[str, np.ndarray]:
    """The split written by `cfmtrain split`: index arrays 'train', 'valid', 'test'."""
    with np.load(path) as data:
        return {p: data[p] for p in PARTS}


def _fraction(text: str) -> float:
    """A --valid/--test value: a number in [0, 1)."""
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in [0, 1)")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain split`."""
    parser.add_argument("--graphs", type=Path, nargs="+", required=True,
                        help="graph store folder(s); several make a union")
    parser.add_argument("--output", type=Path, required=True, help="split .npz to write")
    parser.add_argument("--valid", type=_fraction, default=0.1,
                        help="validation fraction, in [0, 1); valid + test < 1")
    parser.add_argument("--test", type=_fraction, default=0.1, help="test fraction, in [0, 1)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    """Write the split of the store's graphs."""
    from cfmtrain.graphs.store import GraphStore

    if args.valid + args.test >= 1:
        print(f"cfmtrain split: --valid {args.valid} + --test {args.test} must be < 1, or no "
              "graph is left to train on", file=sys.stderr)
        return 2

    store = GraphStore(args.graphs)
    parts = split_indices(store.subsets, (args.valid, args.test), args.seed,
                          store.num_atoms)
    with atomic_path(args.output) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, seed=args.seed, **parts)
    print(", ".join(f"{p}: {len(v)}" for p, v in parts.items()))
    return 0
