"""The size of a graph for packing: atoms (the paper), edges, or a linear cost of both.

The paper (section 3.2.1) notes the size can be defined freely; the linear coefficients can come
from a measured per-batch cost model.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Measure = Literal["atoms", "edges", "linear"]
MEASURES = ("atoms", "edges", "linear")


def graph_costs(num_atoms, num_edges=None, measure: Measure = "atoms", a: float = 1.0,
                b: float = 0.0) -> np.ndarray:
    """Per-graph sizes: atoms or edges (int64), or `a*atoms + b*edges` for measure='linear'.

    The linear cost is int64 when both coefficients are integers, else float64.
    """
    atoms = np.asarray(num_atoms)
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
    if measure == "atoms":
        return atoms.astype(np.int64)
    if num_edges is None:
        raise ValueError(f"measure={measure!r} needs num_edges")
    edges = np.asarray(num_edges)
    if edges.shape != atoms.shape:
        raise ValueError(f"num_atoms {atoms.shape} and num_edges {edges.shape} differ in shape")
    if measure == "edges":
        return edges.astype(np.int64)
    if not (np.isfinite(a) and np.isfinite(b)) or a < 0 or b < 0 or a + b == 0:
        raise ValueError(f"linear cost needs finite a, b >= 0, not both 0; got a={a}, b={b}")
    if float(a).is_integer() and float(b).is_integer():
        return int(a) * atoms.astype(np.int64) + int(b) * edges.astype(np.int64)
    return a * atoms.astype(np.float64) + b * edges.astype(np.float64)
