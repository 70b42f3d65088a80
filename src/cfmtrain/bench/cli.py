"""`cfmtrain bench <name>`: dispatch to one benchmark module (graphs, balance, kernels, accuracy,
loader, isa, md, host, compare, scale, gpu).

Only the chosen module is imported: each pulls in heavy libraries of its own.
"""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS = {
    "graphs": "cfmtrain.bench.graphs",
    "balance": "cfmtrain.bench.balance",
    "kernels": "cfmtrain.bench.kernels",
    "accuracy": "cfmtrain.bench.accuracy",
    "loader": "cfmtrain.bench.loader",
    "isa": "cfmtrain.bench.isa",
    "md": "cfmtrain.bench.md",
    "host": "cfmtrain.bench.host",
    "compare": "cfmtrain.bench.compare",
    "scale": "cfmtrain.bench.scale",
    "gpu": "cfmtrain.bench.gpu",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's name; its own arguments are parsed by its module."""
    parser.add_argument("benchmark", choices=sorted(BENCHMARKS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own arguments")


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark with its own arguments."""
    module = importlib.import_module(BENCHMARKS[args.benchmark])
    parser = argparse.ArgumentParser(prog=f"cfmtrain bench {args.benchmark}")
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(args.args)) or 0)
