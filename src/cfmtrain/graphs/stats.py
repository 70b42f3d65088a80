"""`cfmtrain stats`: the data set's Table 3 (per-subset sizes); its Figure 5 is
`cfmtrain figure fig05_sizes`.

Reads only the per-graph table of a GraphStore, never the arrays.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from cfmtrain.atomic import atomic_path
from cfmtrain.sources.mini import SUBSETS


def subset_table(num_atoms: np.ndarray, num_edges: np.ndarray, subsets: np.ndarray,
                 names: list[str], notes: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per subset: graphs, share, atom and edge ranges, mean neighbours per atom."""
    rows = []
    for sid, name in enumerate(names):
        mask = subsets == sid
        if not mask.any():
            continue
        atoms, edges = num_atoms[mask], num_edges[mask]
        rows.append({
            "subset": name, "graphs": int(mask.sum()), "share": mask.mean(),
            "atoms_min": int(atoms.min()), "atoms_max": int(atoms.max()),
            "edges_min": int(edges.min()), "edges_max": int(edges.max()),
            "mean_neighbours": edges.sum() / max(atoms.sum(), 1),
            "note": (notes or {}).get(name, ""),
        })
    total = {"subset": "total", "graphs": len(num_atoms), "share": 1.0,
             "atoms_min": int(num_atoms.min()), "atoms_max": int(num_atoms.max()),
             "edges_min": int(num_edges.min()), "edges_max": int(num_edges.max()),
             "mean_neighbours": num_edges.sum() / max(num_atoms.sum(), 1), "note": ""}
    return pd.DataFrame([*rows, total])


def markdown(table: pd.DataFrame) -> str:
    """Table 3 as GitHub Markdown."""
    lines = ["| subset | graphs | share | atoms | edges | neighbours/atom | note |",
             "|---|---:|---:|---|---|---:|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.subset} | {r.graphs:,} | {100 * r.share:.1f}% | "
                     f"{r.atoms_min}-{r.atoms_max} | {r.edges_min}-{r.edges_max} | "
                     f"{r.mean_neighbours:.1f} | {r.note} |")
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain stats`."""
    parser.add_argument("--graphs", type=Path, nargs="+", required=True,
                        help="graph store folder(s); several make a union")
    parser.add_argument("--name", required=True, help="data set name for titles")
    parser.add_argument("--csv", type=Path, required=True)
    parser.add_argument("--markdown", type=Path, required=True)


def run(args: argparse.Namespace) -> int:
    """Write Table 3 (CSV, Markdown)."""
    from cfmtrain.graphs.store import GraphStore  # lazy: h5py, torch; light command

    store = GraphStore(args.graphs, check_edges=False)  # the table alone
    notes = _subset_notes(args.name)
    table = subset_table(store.num_atoms, store.num_edges, store.subsets, store.subset_names,
                         notes)
    with atomic_path(args.csv) as tmp:
        table.to_csv(tmp, index=False)
    with atomic_path(args.markdown) as tmp:
        tmp.write_text(f"# Table 3 for `{args.name}`\n\n{markdown(table)}")
    print(markdown(table))
    return 0


def _subset_notes(dataset: str) -> dict[str, str]:
    """Per-subset notes (e.g. stand-in chemistry of the embedded `mini` set)."""
    if not dataset.startswith("mini"):
        return {}
    return {s.name: f"stand-in: {s.description}" if s.stand_in else s.description
            for s in SUBSETS.values()}
