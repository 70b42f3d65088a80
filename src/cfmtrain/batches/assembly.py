"""`cfmtrain::assemble_batch` in PyTorch: the same fields, element for element, for an install
without the compiled extension (a GPU node), and which one a process uses.

Whole-batch tensor operations, no loop over graphs: row ranges gathered through one index per
field, and each edge's shift (unit shifts @ its graph's cell) formed as the compiled op forms it
((u0 c0 + u1 c1) + u2 c2, separate products and sums, no fused multiply-add), so the two agree
bit for bit (tests/batches/test_batch_assembly.py).
"""

from __future__ import annotations

import os
import warnings

import torch

from cfmtrain.kernels.backend import BUILD_HINT, NO_EXTENSION, compiled_ops, is_built

LIBRARY = "cfmtrain._ops_batch_assembly"
COMPILED, TORCH = "compiled", "torch"
_warned: set[str] = set()


def assembly_backend(device: torch.device | str | None) -> str:
    """How a training on `device` assembles its batches: "compiled" where the op is built; else,
    for a device other than the CPU, or anywhere with CFMTRAIN_NO_EXTENSION=1 (an install made
    without it on purpose), "torch" (this module, warned once); a CPU run that expected the op
    is refused (ImportError): the CPU path does not fall back."""
    if is_built(LIBRARY):
        return COMPILED
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cpu" and os.environ.get(NO_EXTENSION) != "1":
        raise ImportError(f"{LIBRARY} is not built (batch assembly): {BUILD_HINT}; a run on a "
                          "CUDA device assembles its batches in PyTorch instead")
    if TORCH not in _warned:
        _warned.add(TORCH)
        warnings.warn(f"{LIBRARY} is not built: batches are assembled in PyTorch "
                      "(cfmtrain.batches.assembly, the same fields)", stacklevel=2)
    return TORCH


def assemble_function(backend: str):
    """The assembly for `backend`: the compiled op, or `assemble_batch_torch`."""
    return compiled_ops(LIBRARY).assemble_batch if backend == COMPILED else assemble_batch_torch


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise RuntimeError(f"assemble_batch: {message}")


def _ranges(start: torch.Tensor, count: torch.Tensor, total: int) -> torch.Tensor:
    """Row indices start[i] .. start[i] + count[i] - 1 for each i, concatenated."""
    first = torch.cumsum(count, 0) - count  # where each range begins in the output
    return torch.repeat_interleave(start - first, count, output_size=total) + torch.arange(total)


def assemble_batch_torch(graphs: torch.Tensor, atom_start: torch.Tensor,
                         num_atoms: torch.Tensor, edge_start: torch.Tensor,
                         num_edges: torch.Tensor, species: torch.Tensor, num_classes: int,
                         atom_fields: list[torch.Tensor], edge_index: torch.Tensor,
                         unit_shifts: torch.Tensor, cells: torch.Tensor,
                         graph_fields: list[torch.Tensor],
                         weights: torch.Tensor | None) -> list[torch.Tensor]:
    """The outputs of cfmtrain::assemble_batch (kernels/batch_assembly.cpp), in its order."""
    stored = num_atoms.shape[0]
    dtype = atom_fields[0].dtype
    _check(dtype in (torch.float32, torch.float64),
           f"fields must be float32 or float64, got {dtype}")
    _check(unit_shifts.dtype in (torch.int8, torch.int16, torch.int32),
           f"unit_shifts must be int8, int16 or int32, got {unit_shifts.dtype}")
    n = graphs.shape[0]
    _check(bool(((graphs >= 0) & (graphs < stored)).all()),
           f"a graph is outside [0, {stored})")
    na, ne = num_atoms[graphs], num_edges[graphs]
    a0, e0 = atom_start[graphs], edge_start[graphs]
    inside = ((a0 >= 0) & (a0 + na <= species.shape[0]) & (e0 >= 0)
              & (e0 + ne <= edge_index.shape[1]))
    _check(bool(inside.all()), "a graph's rows lie outside the arrays")
    ptr = torch.zeros(n + 1, dtype=torch.long)
    torch.cumsum(na, 0, out=ptr[1:])
    atoms, edges = int(ptr[-1]), int(ne.sum())
    index = torch.arange(n)
    out = [torch.repeat_interleave(index, na, output_size=atoms), ptr]

    rows = _ranges(a0, na, atoms)
    kinds = species[rows]
    bad = (kinds < 0) | (kinds >= num_classes)
    if bool(bad.any()):
        at = int(torch.nonzero(bad)[0, 0])
        graph = int(graphs[torch.searchsorted(ptr, at, right=True) - 1])
        raise RuntimeError(f"assemble_batch: unknown element in graph {graph}")
    attrs = torch.zeros(atoms, num_classes, dtype=dtype)
    attrs[torch.arange(atoms), kinds] = 1
    out.append(attrs)
    out += [field[rows] for field in atom_fields]

    erows = _ranges(e0, ne, edges)
    offset = torch.repeat_interleave(ptr[:-1], ne, output_size=edges)
    out.append(edge_index[:, erows].long() + offset)
    unit = unit_shifts[erows].to(dtype)
    cell = cells[torch.repeat_interleave(graphs, ne, output_size=edges)]
    shifts = (unit[:, 0:1] * cell[:, 0] + unit[:, 1:2] * cell[:, 1]) + unit[:, 2:3] * cell[:, 2]
    out += [unit, shifts]

    out += [field[graphs] for field in graph_fields]
    out.append(weights.clone() if weights is not None else torch.ones(n, dtype=dtype))
    # mace-torch's constant fields, in the compiled op's order (batching.OUTPUTS)
    out += [torch.zeros(shape, dtype=dtype) for shape in
            ((n, 3, 3), (n, 3, 3), (n, 3), (n, 3), (n,), (n,), (n,), (atoms,), (atoms, 1))]
    out.append(torch.zeros(n, dtype=torch.long))  # head
    out += [torch.ones(shape, dtype=dtype) for shape in
            ((n,), (n,), (n,), (n,), (n,), (n, 3), (n, 3, 3))]
    return out
