"""Batch assembly in PyTorch (cfmtrain.batches.assembly, for installs without the compiled
extension) against the compiled cfmtrain::assemble_batch: every field equal element for element
and bit for bit, on the loader's store of periodic, slab and molecular graphs and on random
arrays with int8/int16/int32 unit shifts; the same refusals; and which one a run uses."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from helpers import CUTOFF
from test_loader import BATCHES, Z_TABLE, union  # noqa: F401  (union: a fixture)

from cfmtrain.batches import assembly
from cfmtrain.batches.assembly import assemble_batch_torch, assembly_backend
from cfmtrain.batches.batching import OUTPUTS, BatchAssembler
from cfmtrain.batches.data import GraphDataset
from cfmtrain.batches.store_arrays import StoreArrays


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and bits (NaN-safe: compared as raw bytes)."""
    return (a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_assembly_equals_the_compiled_op_on_a_store(union, dtype):  # noqa: F811
    order = np.random.default_rng(0).permutation(len(union))
    for stress in (True, False):
        dataset = GraphDataset(union, order, Z_TABLE, CUTOFF, dtype, use_stress=stress)
        for budget in (2**40, 0):  # arrays in memory; rows read from the shards
            compiled = BatchAssembler(dataset, StoreArrays(union, budget))
            ours = BatchAssembler(dataset, StoreArrays(union, budget))
            assert compiled.backend == "compiled"
            ours.backend = assembly.TORCH
            for items in BATCHES:
                a, b = compiled(items), ours(items)
                for name in (*OUTPUTS, "store_id"):
                    assert same(getattr(b, name), getattr(a, name)), (name, items, budget)


def random_arrays(rng: np.random.Generator, dtype: torch.dtype, shift_dtype: torch.dtype):
    """A store of 12 random graphs in the op's layout: rows of each graph contiguous, in
    shuffled order, with large unit shifts and skewed cells."""
    graphs = 12
    na = rng.integers(1, 7, graphs)
    ne = rng.integers(0, 15, graphs)
    a_order, e_order = rng.permutation(graphs), rng.permutation(graphs)
    a_start = np.zeros(graphs, np.int64)
    a_start[a_order] = np.cumsum(na[a_order]) - na[a_order]
    e_start = np.zeros(graphs, np.int64)
    e_start[e_order] = np.cumsum(ne[e_order]) - ne[e_order]
    atoms, edges = int(na.sum()), int(ne.sum())
    local = np.concatenate([rng.integers(0, na[g], (2, ne[g])) for g in e_order], axis=1)
    t = lambda x, d=None: torch.as_tensor(np.ascontiguousarray(x), dtype=d)  # noqa: E731
    cells = rng.normal(size=(graphs, 3, 3)) * 3 + np.eye(3) * 5
    return {
        "atom_start": t(a_start), "num_atoms": t(na), "edge_start": t(e_start),
        "num_edges": t(ne), "species": t(rng.integers(0, 4, atoms)), "num_classes": 4,
        "atom_fields": [t(rng.normal(size=(atoms, 3)), dtype), t(rng.normal(size=(atoms, 3)),
                                                                   dtype)],
        "edge_index": t(local, torch.int32),
        "unit_shifts": t(rng.integers(-9, 10, (edges, 3)), shift_dtype),
        "cells": t(cells, dtype),
        "graph_fields": [t(rng.normal(size=graphs), dtype), t(rng.normal(size=(graphs, 3, 3)),
                                                               dtype),
                         t(rng.integers(0, 2, (graphs, 3)).astype(bool))],
    }


def call(fn, graphs, arrays, weights=None):
    a = arrays
    return fn(torch.as_tensor(graphs, dtype=torch.long), a["atom_start"], a["num_atoms"],
              a["edge_start"], a["num_edges"], a["species"], a["num_classes"], a["atom_fields"],
              a["edge_index"], a["unit_shifts"], a["cells"], a["graph_fields"], weights)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shift_dtype", [torch.int8, torch.int16, torch.int32])
def test_torch_assembly_equals_the_compiled_op_on_random_arrays(dtype, shift_dtype):
    compiled = torch.ops.cfmtrain.assemble_batch
    for seed in range(6):
        rng = np.random.default_rng(seed)
        arrays = random_arrays(rng, dtype, shift_dtype)
        graphs = rng.integers(0, 12, rng.integers(1, 10))  # repeats allowed
        weights = torch.as_tensor(rng.random(len(graphs)), dtype=dtype)
        for w in (None, weights):
            got, want = call(assemble_batch_torch, graphs, arrays, w), call(compiled, graphs,
                                                                             arrays, w)
            assert len(got) == len(want) == len(OUTPUTS) - 4  # 3 graph fields here, not 7
            for k, (a, b) in enumerate(zip(got, want, strict=True)):
                assert same(a, b), (k, seed)


def test_torch_assembly_refuses_what_the_op_refuses():
    arrays = random_arrays(np.random.default_rng(3), torch.float64, torch.int8)
    for fn in (torch.ops.cfmtrain.assemble_batch, assemble_batch_torch):
        with pytest.raises(RuntimeError, match="is outside"):
            call(fn, [0, 12], arrays)
        bad = {**arrays, "species": arrays["species"].clone()}
        bad["species"][int(arrays["atom_start"][5])] = 7  # no class 7 of 4
        with pytest.raises(RuntimeError, match="unknown element in graph 5"):
            call(fn, [2, 5], bad)
        with pytest.raises(RuntimeError, match="unit_shifts must be int8, int16 or int32"):
            call(fn, [0], {**arrays, "unit_shifts": arrays["unit_shifts"].long()})


def test_a_cpu_run_needs_the_compiled_op_and_a_cuda_run_falls_back_once(monkeypatch):
    """Where the op is not built: a CPU run is refused by name; a CUDA run assembles in PyTorch,
    warned about once."""
    assert assembly_backend("cpu") == assembly_backend("cuda") == "compiled"
    monkeypatch.delenv(assembly.NO_EXTENSION, raising=False)
    monkeypatch.setattr(assembly, "is_built", lambda name: False)
    monkeypatch.setattr(assembly, "_warned", set())
    for device in (None, "cpu", torch.device("cpu")):
        with pytest.raises(ImportError, match=r"_ops_batch_assembly is not built \(batch "
                                              r"assembly\): run `python setup.py build_ext"):
            assembly_backend(device)
    with pytest.warns(UserWarning, match="batches are assembled in PyTorch"):
        assert assembly_backend(torch.device("cuda", 0)) == "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert assembly_backend("cuda") == "torch"  # said once
    monkeypatch.setenv(assembly.NO_EXTENSION, "1")  # an install made without it on purpose
    assert assembly_backend("cpu") == "torch"
