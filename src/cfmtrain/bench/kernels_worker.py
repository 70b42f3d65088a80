"""One configuration of `cfmtrain bench kernels`, run inside its own subprocess.

The paper-size model (128x0e+128x1o, lmax 3, correlation 3, 2 layers, 8 Bessel, r_max 4.5) on a
rattled fcc Cu80Ni20 supercell (~39 neighbours per atom); prints one JSON line of results.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import traceback
from collections.abc import Callable

import mace  # noqa: F401  (before e3nn)
import numpy as np
import torch

R_MAX = 4.5
ZS = [28, 29]
OOM_MARKERS = ("can't allocate memory", "not enough memory", "out of memory", "std::bad_alloc")


def supercell(num_atoms: int, seed: int = 0):
    """A rattled fcc Cu supercell of exactly `num_atoms` (4 per cell), 20% Ni at random."""
    import ase.build

    if num_atoms % 4:
        raise ValueError(f"atoms must be a multiple of 4 (fcc cells), got {num_atoms}")
    cells = num_atoms // 4
    shape = min(((a, b, cells // (a * b)) for a in range(1, cells + 1)
                 for b in range(a, cells + 1) if cells % (a * b) == 0 and cells // (a * b) >= b),
                key=lambda s: max(s) / min(s))
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True) * shape
    rng = np.random.default_rng(seed)
    atoms.numbers[rng.random(len(atoms)) < 0.2] = 28
    atoms.rattle(0.05, seed=seed)
    return atoms


def paper_model(dtype: torch.dtype, reduced_cg: bool, for_compile: bool = False) -> torch.nn.Module:
    """The project's ScaleShiftMACE at the paper's size (cfmtrain.train.model)."""
    from cfmtrain.train.config import ModelConfig
    from cfmtrain.train.model import DataStats, build_model

    stats = DataStats(zs=ZS, e0s=[-5.0, -4.0], avg_num_neighbors=39.0, mean=0.0, std=1.0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        def factory():
            return build_model(ModelConfig(use_reduced_cg=reduced_cg), stats, R_MAX, seed=0)
        if for_compile:
            from mace.tools.compile import prepare

            return prepare(factory)().to(dtype)
        return factory().to(dtype)
    finally:
        torch.set_default_dtype(previous)


def make_batch(atoms, dtype: torch.dtype) -> dict:
    from mace import data, tools
    from mace.tools import torch_geometric

    config = data.config_from_atoms(atoms)
    item = data.AtomicData.from_config(config, z_table=tools.AtomicNumberTable(ZS), cutoff=R_MAX)
    batch = next(iter(torch_geometric.dataloader.DataLoader([item], batch_size=1)))
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.to_dict().items()}


def model_pass(model: torch.nn.Module, batch: dict, kind: str) -> Callable[[], None]:
    """forward: energy; forward_backward: energy and forces; train_step: E+F loss, Adam step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step() -> None:
        if kind == "forward":
            with torch.no_grad():
                model(dict(batch), training=False, compute_force=False)
        elif kind == "forward_backward":
            model(dict(batch), training=False, compute_force=True)
        else:
            out = model(dict(batch), training=True, compute_force=True)
            loss = out["energy"].pow(2).mean() + 10.0 * out["forces"].pow(2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return step


def contraction_pass(modules: list, x0: torch.Tensor, y: torch.Tensor,
                     kind: str) -> Callable[[], None]:
    """Both layers' symmetric contractions; train_step = force-like double backward."""
    def step() -> None:
        if kind == "forward":
            with torch.no_grad():
                for m in modules:
                    m(x0, y)
            return
        x = x0.detach().requires_grad_(True)
        outs = [m(x, y) for m in modules]
        if kind == "forward_backward":
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            return
        energy = sum(o.pow(2).sum() for o in outs)
        (gx,) = torch.autograd.grad(energy, x, create_graph=True)
        (energy + gx.pow(2).sum()).backward()
    return step


def conv_pass(convs: list, inputs: list, kind: str) -> Callable[[], None]:
    """Both layers' convs; train_step = force-like double backward through x, Y and W."""
    def step() -> None:
        if kind == "forward":
            with torch.no_grad():
                for conv, args in zip(convs, inputs, strict=True):
                    conv(*args)
            return
        leaves = [[t.detach().requires_grad_(True) for t in args] for args in inputs]
        outs = [conv(*args) for conv, args in zip(convs, leaves, strict=True)]
        if kind == "forward_backward":
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            return
        flat = [t for args in leaves for t in args]
        energy = sum(o.pow(2).sum() for o in outs)
        grads = torch.autograd.grad(energy, flat, create_graph=True)
        (energy + sum(g.pow(2).sum() for g in grads)).backward()
    return step


def conv_setup(model: torch.nn.Module, batch: dict, impl: str) -> tuple[list, list]:
    """Each interaction block's conv as a callable (x, Y, W) -> messages, and its inputs:
    random features and radial weights, spherical harmonics of the batch's edge vectors."""
    from mace.modules.utils import get_edge_vectors_and_lengths
    from mace.tools.scatter import scatter_sum

    from cfmtrain.kernels.conv import FusedChannelwiseConv

    edge_index = batch["edge_index"]
    vectors, _ = get_edge_vectors_and_lengths(batch["positions"], edge_index, batch["shifts"])
    attrs = model.spherical_harmonics(vectors).detach()
    gen = torch.Generator().manual_seed(0)
    num_nodes, num_edges = batch["positions"].shape[0], edge_index.shape[1]
    convs, inputs = [], []
    for block in model.interactions:
        tp = block.conv_tp
        x = torch.randn(num_nodes, tp.irreps_in1.dim, generator=gen).to(attrs.dtype)
        w = torch.randn(num_edges, tp.weight_numel, generator=gen).to(attrs.dtype)
        inputs.append([x, attrs, w])
        if impl == "fused":
            fused = FusedChannelwiseConv(tp)
            convs.append(lambda x, y, w, f=fused: f(x, y, w, edge_index))
            continue

        def mace_conv(x, y, w, tp=tp):
            messages = tp(x[edge_index[0]], y, w)
            return scatter_sum(src=messages, index=edge_index[1], dim=0, dim_size=x.shape[0])
        convs.append(torch.compile(mace_conv) if impl == "compile" else mace_conv)
    return convs, inputs


def setup(config: dict) -> tuple[Callable[[], None], dict]:
    """The timed step for `config` and facts about it (edges, backend)."""
    dtype = getattr(torch, config["dtype"])
    impl = config["impl"]
    atoms = supercell(config["atoms"])
    model = paper_model(dtype, config["cg"] == "reduced", for_compile=impl == "compile")
    batch = make_batch(atoms, dtype)
    facts = {"edges": int(batch["edge_index"].shape[1]), "backend": "mace-e3nn"}
    if config["op"] == "model":
        if impl == "fused":
            from cfmtrain.kernels import fuse_model, kernel_backend

            fuse_model(model)
            facts["backend"] = json.dumps(kernel_backend(model))
        elif impl == "compile":
            model = torch.compile(model)
            facts["backend"] = "torch.compile"
        return model_pass(model, batch, config["pass"]), facts
    if config["op"] == "conv":
        convs, inputs = conv_setup(model, batch, impl)
        facts["backend"] = {"fused": "cpu-fused", "compile": "torch.compile"}.get(impl, "e3nn")
        return conv_pass(convs, inputs, config["pass"]), facts
    modules = [p.symmetric_contractions for p in model.products]
    if impl == "fused":
        from cfmtrain.kernels.symmetric_contraction import SymmetricContractionFused

        modules = [SymmetricContractionFused(m) for m in modules]
        facts["backend"] = "cpu-fused"
    elif impl == "compile":
        modules = [torch.compile(m) for m in modules]
        facts["backend"] = "torch.compile"
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(len(atoms), 128, 16, generator=gen).to(dtype)
    return contraction_pass(modules, x, batch["node_attrs"], config["pass"]), facts


def time_step(step: Callable[[], None], reps: int) -> dict:
    """First call (compile/warm-up) timed apart, one more warm-up, then `reps` timed calls
    (wall and process CPU seconds)."""
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    step()
    times, cpu_times = [], []
    for _ in range(reps):
        start, cpu_start = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    # CPU seconds (all threads) are recorded too: on a shared machine they move less than wall
    return {"median_s": statistics.median(times), "min_s": min(times), "times": times,
            "median_cpu_s": statistics.median(cpu_times), "compile_s": first}


def main(config: dict) -> int:
    """Run `config`; print one JSON line (status ok / oom / error) and return 0."""
    result: dict = {"threads": torch.get_num_threads(),
                    "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "")}
    try:
        step, facts = setup(config)
        result.update(facts)
        result.update(time_step(step, config["reps"]))
        result["status"] = "ok"
    except Exception as error:  # any failure is a result of the benchmark, recorded as such
        text = f"{type(error).__name__}: {error}"
        oom = isinstance(error, MemoryError) or any(m in text for m in OOM_MARKERS)
        result["status"] = "oom" if oom else "error: " + (text.splitlines() or [""])[0][:200]
        traceback.print_exc()
    print(json.dumps(result), flush=True)
    return 0
