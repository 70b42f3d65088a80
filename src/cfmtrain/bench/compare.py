"""`cfmtrain bench compare`: judge a kernel change as paired rounds in one process.

Two switches of one op (e.g. `--arms fused mace`: cfmtrain's fused kernels against mace-torch's
modules) are set up side by side on the same seeded input (bench/kernels_worker.py's setups),
checked to compute the same values, then timed in alternating rounds in shuffled order
(cfmtrain.measure.paired). The table gives each arm's median time, wall and CPU per round, and
the paired speed-up against the first arm with its 10-90% range; results/bench/compare.csv.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from cfmtrain.bench import WARMUP_CALLS
from cfmtrain.bench.kernels import CHILD_ENV, OPS, PASSES
from cfmtrain.bench.kernels_worker import fingerprint, setup
from cfmtrain.bench.table import report
from cfmtrain.measure.paired import run_rounds, table

IMPLS = ("mace", "fused")
AGREE = 1e-3  # largest difference of the arms' fingerprints, relative to the output's norm


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The op, its size and pass, the two arms and the rounds."""
    parser.add_argument("--op", choices=OPS, default="symmetric_contraction")
    parser.add_argument("--arms", nargs=2, choices=IMPLS, default=["mace", "fused"],
                        metavar="IMPL", help="reference then candidate (mace, fused)")
    parser.add_argument("--atoms", type=int, default=96)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--pass", dest="kind", choices=PASSES, default="train_step")
    parser.add_argument("--model", choices=("paper", "tiny"), default="paper",
                        help="the paper's model size, or a tiny one (tests)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=3, help="calls of the op per arm and round")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rounds' order")
    parser.add_argument("--csv", type=Path, default=Path("results/bench/compare.csv"))


def _arm(step, calls: int):
    def run() -> None:
        for _ in range(calls):
            step(False)
    return run


def run(args: argparse.Namespace) -> int:
    """Set both arms up, check they agree, time them in paired rounds, print and write."""
    for key, value in CHILD_ENV.items():  # what bench kernels' children run with
        os.environ.setdefault(key, value)
    config = {"op": args.op, "atoms": args.atoms, "dtype": args.dtype, "pass": args.kind,
              "cg": "original", "model": args.model, "reps": 1}
    steps, prints = {}, {}
    for impl in args.arms:
        steps[impl], _ = setup({**config, "impl": impl})
        prints[impl] = fingerprint(steps[impl](True) or {})
        for _ in range(WARMUP_CALLS):
            steps[impl](False)
    reference, candidate = args.arms
    for key in prints[reference]:
        a, b = np.asarray(prints[reference][key]), np.asarray(prints[candidate].get(key, []))
        if a.shape != b.shape or np.abs(a - b).max() > AGREE * max(abs(a[0]), 1e-30):
            print(f"error: {candidate} and {reference} differ in {key}: {b} against {a}")
            return 1
    rounds = run_rounds({impl: _arm(steps[impl], args.calls) for impl in args.arms},
                        args.rounds, args.seed)
    rows = [{"op": args.op, "atoms": args.atoms, "dtype": args.dtype, "pass": args.kind,
             "model": args.model, "calls": args.calls, **row}
            for row in table(rounds, reference)]
    report(rows, args.csv, f"{args.op} {args.kind}, {args.atoms} atoms, {args.dtype}: "
           f"paired rounds, speed-up against {reference}")
    return 0
