"""`cfmtrain evaluate`: a model's errors (energy per atom, forces, stress; MAE and RMSE) per
config_type and overall, on a split of a graph store or on a file of labelled frames, written as
a CSV; its parity plot (table beside it), and with --epochs the run's learning curves.

The model is evaluated as it is (its dtype; kernels unfused unless --fuse), on batches
assembled by cfmtrain's loader, which are mace-torch's: the numbers are mace-torch's own
evaluation of the same frames (tests/evaluate/test_evaluate.py compares them with
mace_eval_configs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import mace  # noqa: F401  (before e3nn)
import numpy as np
import torch

from cfmtrain.evaluate.errors import error_rows, parity_rows
from cfmtrain.evaluate.frames import frames_store
from cfmtrain.evaluate.predict import predict
from cfmtrain.evaluate.records import EvaluationRecord, ParityRecord
from cfmtrain.graphs.split import read_split
from cfmtrain.graphs.store import GraphStore
from cfmtrain.kernels import fuse_model
from cfmtrain.plots.model import draw_learning_curves, draw_parity
from cfmtrain.readers.own import parse_keys
from cfmtrain.tables import read_table, write_table
from cfmtrain.train.epochs import EpochRecord

PARTS = ("test", "valid", "train", "all")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, required=True,
                        help="a mace-torch .model file (a pickle: load only models you trust)")
    data = parser.add_mutually_exclusive_group(required=True)
    data.add_argument("--graphs", type=Path, nargs="+",
                      help="graph store folder(s), several make a union; with --split")
    data.add_argument("--frames", type=Path,
                      help="a file of labelled frames (extxyz or any format cfmtrain reads; "
                           "labels as for own data, isolated atoms left out)")
    parser.add_argument("--split", type=Path, help="split .npz (default: <graphs>/split.npz)")
    parser.add_argument("--part", choices=PARTS, default="test",
                        help="which part of the split (default: test)")
    parser.add_argument("--key", action="append", default=[], metavar="FIELD=NAME",
                        help="--frames: a label's name in the file, as config `keys` "
                             "(energy, forces, stress, virial, config_type)")
    parser.add_argument("--output", type=Path, required=True, help="the errors' CSV")
    parser.add_argument("--parity", type=Path,
                        help="parity plot PNG, its table (.csv) and a PDF beside it "
                             "(default: parity.png beside --output)")
    parser.add_argument("--epochs", type=Path,
                        help="the run's epochs.csv: draw its learning curves too")
    parser.add_argument("--curves", type=Path,
                        help="learning curves PNG (default: learning_curves.png beside "
                             "--output)")
    parser.add_argument("--title", default="", help="figure titles' prefix (default: the model)")
    parser.add_argument("--batch-graphs", type=int, default=16, help="graphs per batch")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument("--fuse", action="store_true",
                        help="cfmtrain's fused kernels (faster; numbers equal to float rounding)")


def load_model(path: Path, fuse: bool = False) -> torch.nn.Module:
    """A mace-torch model file (a full pickle), fused with --fuse."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: model file not found")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torch.load(path, map_location="cpu", weights_only=False)
    if not hasattr(model, "atomic_numbers") or not hasattr(model, "r_max"):
        raise ValueError(f"{path}: not a mace-torch model (no atomic_numbers/r_max)")
    return fuse_model(model) if fuse else model


def selected(store: GraphStore, split: Path, part: str) -> np.ndarray:
    """Store indices of `part` of the split (all: every graph of the store)."""
    if part == "all":
        return np.arange(len(store))
    indices = read_split(split)[0][part]
    if not len(indices):
        raise ValueError(f"{split}: its {part} part holds no graphs")
    return indices


def run(args: argparse.Namespace) -> int:
    try:
        model = load_model(args.model, args.fuse)
        with tempfile.TemporaryDirectory(prefix="cfmtrain-evaluate-") as scratch:
            if args.frames is not None:
                store = frames_store(args.frames, parse_keys(args.key), float(model.r_max),
                                     Path(scratch))
                indices, what = np.arange(len(store)), str(args.frames)
            else:
                graphs = args.graphs if len(args.graphs) > 1 else args.graphs[0]
                store = GraphStore(graphs)
                split = args.split or args.graphs[0] / "split.npz"
                indices = selected(store, split, args.part)
                what = f"{args.part} part of {split}"
            pred = predict(model, store, indices, args.batch_graphs, args.device)
            store.close()
    except (FileNotFoundError, ValueError) as err:
        print(f"cfmtrain evaluate: {err}", file=sys.stderr)
        return 2
    rows = error_rows(pred)
    write_table(args.output, rows, EvaluationRecord)
    print(f"{args.model} on the {len(pred.graphs)} graphs of the {what}:", file=sys.stderr)
    for r in rows:
        stress = (f", S {r.mae_stress_meV_per_A3:.3g}" if r.stress_graphs else "")
        print(f"  {r.config_type:>16}: {r.graphs:5d} graphs, MAE E {r.mae_energy_meV_per_atom:8.2f}"
              f" meV/atom, F {r.mae_forces_meV_per_A:8.1f} meV/Å{stress}", file=sys.stderr)
    print(f"wrote {args.output}")
    title = args.title or str(args.model)
    parity = args.parity or args.output.with_name("parity.png")
    write_table(parity.with_suffix(".csv"), parity_rows(pred), ParityRecord)
    table = read_table(parity.with_suffix(".csv"), ParityRecord)
    drawn = draw_parity(table, parity, f"{title}: {what}")
    if args.epochs is not None:
        curves = args.curves or args.output.with_name("learning_curves.png")
        drawn += draw_learning_curves(read_table(args.epochs, EpochRecord), curves,
                                      f"{title}: learning curves")
    print(f"wrote {parity.with_suffix('.csv')}, {', '.join(map(str, drawn))}")
    return 0
