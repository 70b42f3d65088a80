"""`cfmtrain bench <name>`: dispatch to one benchmark module (graphs, balance, kernels)."""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS = {
    "graphs": "cfmtrain.bench.graphs",
    "balance": "cfmtrain.bench.balance",
    "kernels": "cfmtrain.bench.kernels",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One sub-parser per benchmark, each filled by its own module."""
    sub = parser.add_subparsers(dest="benchmark", required=True)
    for name, module_name in BENCHMARKS.items():
        sub_parser = sub.add_parser(name)
        importlib.import_module(module_name).add_arguments(sub_parser)


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark."""
    return int(importlib.import_module(BENCHMARKS[args.benchmark]).run(args) or 0)
