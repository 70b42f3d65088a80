"""`cfmtrain split`: the seeded train/valid/test split of a graph store, shared by every stage.

Stratified by subset (config_type) and, within each, by size (atoms), so that every subset
and size range appears in each part in proportion. A subset too small to give each requested
part a graph (fraction x its graphs < 1) joins a pooled remainder, split the same way. So each
part's count is within one graph of its fraction in every stratum, and with 3 or more graphs
every requested part gets at least one (fewer graphs are refused). A split leaves out the later
copies of a structure held more than once, in one data set or in several members of a union
(cfmtrain.graphs.duplicates), saying so, so that no structure is in two parts. Written as .npz
with the requested and realised fractions, the graphs left out and the fingerprint of the store
it splits, which training checks.
"""

from __future__ import annotations

import argparse
import math
import sys
import zipfile
from pathlib import Path

import numpy as np

from cfmtrain.atomic import atomic_path

PARTS = ("train", "valid", "test")
POOLED = "(pooled small subsets)"


class SplitError(ValueError):
    """A split that cannot be made or read; the message names the file or the fractions."""


def _spread(n: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Positions 0..n-1 (in size order) picked evenly for a part of `fraction` of n, with a
    random phase: systematic sampling, so each size range gives its share and the count is
    floor or ceil of fraction x n."""
    if n < 1 or fraction <= 0:
        return np.zeros(0, np.int64)
    phase = rng.random()
    picks = np.flatnonzero(np.diff(np.floor(phase + min(fraction, 1.0) * np.arange(n + 1))) > 0)
    return picks.astype(np.int64)


def check_fractions(valid: float, test: float) -> None:
    """SplitError unless both are finite, >= 0 and sum to less than 1."""
    if not (math.isfinite(valid) and math.isfinite(test)) or valid < 0 or test < 0 \
            or valid + test >= 1:
        raise SplitError(f"split fractions valid={valid}, test={test} must be finite, >= 0 and "
                         "sum to less than 1")


def strata(subsets: np.ndarray, fractions: tuple[float, float]) -> list[tuple[str, np.ndarray]]:
    """(name, members) of each stratum: a subset that can give every requested part at least
    one graph in expectation, and the pooled remainder of the smaller ones."""
    requested = [f for f in fractions if f > 0]
    smallest = min(requested, default=1.0)
    found, pooled = [], []
    for subset in np.unique(subsets):
        members = np.flatnonzero(subsets == subset)
        (found.append((str(subset), members)) if smallest * len(members) >= 1
         else pooled.append(members))
    if pooled:
        found.append((POOLED, np.concatenate(pooled)))
    return found


def split_indices(subsets: np.ndarray, fractions: tuple[float, float], seed: int,
                  sizes: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Seeded (valid, test) = `fractions` of each stratum (see `strata`), spread over its
    graphs' `sizes` (atoms) so that rare large or small structures land in every part; sorted
    indices. With 3+ graphs each requested part gets at least one (taken from the largest
    other part); fewer graphs with a requested part are refused."""
    valid_frac, test_frac = fractions
    check_fractions(valid_frac, test_frac)
    subsets = np.asarray(subsets)
    n = len(subsets)
    if n < 3 and (valid_frac > 0 or test_frac > 0):
        raise SplitError(f"{n} graph(s) cannot be split into train, validation and test (3 are "
                         "needed); set the split's valid and test fractions to 0 to train on all")
    sizes = np.zeros(n) if sizes is None else np.asarray(sizes)
    rng = np.random.default_rng(seed)
    part = np.zeros(n, np.int64)  # 0 train, 1 valid, 2 test
    for _, members in strata(subsets, fractions):
        members = rng.permutation(members)
        members = members[np.argsort(sizes[members], kind="stable")]  # by size, random ties
        valid = _spread(len(members), valid_frac, rng)
        part[members[valid]] = 1
        rest = np.delete(members, valid)
        if len(rest):  # test's count: floor or ceil of test_frac x the stratum's graphs
            part[rest[_spread(len(rest), test_frac * len(members) / len(rest), rng)]] = 2
    for wanted, fraction in ((1, valid_frac), (2, test_frac), (0, 1.0)):
        if fraction > 0 and n and not (part == wanted).any():
            counts = np.bincount(part, minlength=3)
            donor = int(np.argmax(np.where(np.arange(3) == wanted, -1, counts)))
            part[rng.choice(np.flatnonzero(part == donor))] = wanted
    return {name: np.flatnonzero(part == k).astype(np.int64) for k, name in enumerate(PARTS)}


def realised(parts: dict[str, np.ndarray]) -> dict[str, float]:
    """Each part's share of the graphs."""
    total = sum(len(v) for v in parts.values())
    return {p: len(v) / total if total else 0.0 for p, v in parts.items()}


def describe(parts: dict[str, np.ndarray], fractions: tuple[float, float],
             pooled: int = 0) -> str:
    """One line: each part's count and share, the requested fractions, the pooled graphs."""
    shares = realised(parts)
    text = ", ".join(f"{p} {len(parts[p])} ({100 * shares[p]:.1f}%)" for p in PARTS)
    text += f"; requested valid {100 * fractions[0]:g}%, test {100 * fractions[1]:g}%"
    return text + (f"; {pooled} graphs of small subsets pooled" if pooled else "")


def load_split(path: str | Path) -> dict[str, np.ndarray]:
    """The split written by `cfmtrain split`: index arrays 'train', 'valid', 'test'."""
    return read_split(path)[0]


def read_split(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """(index arrays 'train', 'valid', 'test'; the recorded provenance: store fingerprint,
    fractions, seed, or {} for a split written without it). SplitError names the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no split file (written by `cfmtrain split`)")
    try:
        with np.load(path, allow_pickle=False) as data:
            parts = {p: np.asarray(data[p], np.int64) for p in PARTS}
            meta = {k: data[k].tolist() for k in data.files if k not in PARTS}
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, KeyError) as err:
        raise SplitError(f"{path}: unreadable, truncated or not a split ({type(err).__name__}: "
                         f"{err}); delete it and rerun `cfmtrain split` (snakemake: the graphs "
                         "target)") from None
    if any(v.ndim != 1 for v in parts.values()):
        raise SplitError(f"{path}: index arrays must be one-dimensional")
    return parts, meta


def check_split_for(path: str | Path, meta: dict, store_fingerprint: str) -> None:
    """SplitError if the split records a store other than the one with `store_fingerprint`."""
    recorded = meta.get("store")
    if recorded is not None and str(recorded) != store_fingerprint:
        raise SplitError(f"{path}: made for other graphs (store {str(recorded)[:12]}, these are "
                         f"{store_fingerprint[:12]}): a split of another data set, cutoff or "
                         "conversion; delete it and rerun `cfmtrain split`")


def _fraction(text: str) -> float:
    """A --valid/--test value: a finite number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and 0 <= value < 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in [0, 1)")
    return value


def _seed(text: str) -> int:
    """A --seed value: an integer >= 0 (numpy's generators refuse negative seeds)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative (seeds are >= 0)")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain split`."""
    parser.add_argument("--graphs", type=Path, nargs="+", required=True,
                        help="graph store folder(s); several make a union")
    parser.add_argument("--output", type=Path, required=True, help="split .npz to write")
    parser.add_argument("--valid", type=_fraction, default=0.1,
                        help="validation fraction, in [0, 1); valid + test < 1")
    parser.add_argument("--test", type=_fraction, default=0.1, help="test fraction, in [0, 1)")
    parser.add_argument("--seed", type=_seed, default=0, help="split seed, >= 0")


def run(args: argparse.Namespace) -> int:
    """Write the split of the store's graphs; print and record the realised fractions."""
    from cfmtrain.graphs.store import GraphStore, ShardError  # lazy: h5py, torch; light command

    fractions = (args.valid, args.test)
    if args.valid + args.test >= 1:
        print(f"cfmtrain split: --valid {args.valid} + --test {args.test} must be < 1, or no "
              "graph is left to train on", file=sys.stderr)
        return 2
    try:
        check_fractions(*fractions)
        store = GraphStore(args.graphs, check_edges=False)
        # each structure once: its first graph (of the first member of a union holding it)
        from cfmtrain.graphs.duplicates import describe as shared_line
        from cfmtrain.graphs.duplicates import shared_structures

        copies, shared = shared_structures(list(args.graphs), store)
        for pair in shared:
            print(f"warning: {shared_line(pair)}", file=sys.stderr)
        kept = np.flatnonzero(~copies)
        parts = {name: kept[idx] for name, idx in split_indices(
            store.subsets[kept], fractions, args.seed, store.num_atoms[kept]).items()}
    except (SplitError, ShardError, FileNotFoundError) as err:
        print(f"cfmtrain split: {err}", file=sys.stderr)
        return 2
    pooled = sum(len(m) for name, m in strata(store.subsets[kept], fractions) if name == POOLED)
    shares = realised(parts)
    left_out = len(store) - len(kept)
    with atomic_path(args.output) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, seed=args.seed, store=store.fingerprint, cutoff=store.cutoff,
                     requested=np.array(fractions), pooled=pooled, left_out=left_out,
                     realised=np.array([shares[p] for p in PARTS]), **parts)
    print(describe(parts, fractions, pooled)
          + (f"; {left_out} copies of structures held before left out" if left_out else ""))
    return 0
