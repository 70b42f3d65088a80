"""One configuration of `cfmtrain bench kernels`, run inside its own subprocess.

The paper-size model (128x0e+128x1o, lmax 3, correlation 3, 2 layers, 8 Bessel, r_max the
paper's cutoff) on a rattled fcc Cu80Ni20 supercell (~39 neighbours per atom), or a tiny one to
test the harness; prints one JSON line of results, with a fingerprint of what the first call
computed from seeded inputs (to compare implementations) and, for the fused ops, the FLOPs one
step executes (bench/flops.py).
"""

from __future__ import annotations

import json
import os
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import mace  # noqa: F401  (before e3nn)
import numpy as np
import torch
from e3nn import o3

from cfmtrain.atomic import atomic_path
from cfmtrain.bench import WARMUP_CALLS
from cfmtrain.bench.flops import count_flops
from cfmtrain.paper import CUTOFF
from cfmtrain.train.config import ModelConfig

R_MAX = CUTOFF
ZS = [28, 29]
OOM_MARKERS = ("can't allocate memory", "not enough memory", "out of memory", "std::bad_alloc")
# Model sizes: the paper's, and a tiny one (same structure) for smoke tests of the harness.
MODELS = {"paper": {},
          "tiny": {"hidden_irreps": "8x0e+8x1o", "max_ell": 2, "correlation": 2,
                   "radial_mlp": [16]}}
# A step returns None, or with record=True a dict of named tensors it computed (its fingerprint).
Step = Callable[[bool], dict | None]


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


def paper_model(dtype: torch.dtype, reduced_cg: bool, for_compile: bool = False,
                size: str = "paper") -> torch.nn.Module:
    """The project's ScaleShiftMACE at the paper's size (or `size` of MODELS), seed 0."""
    from cfmtrain.train.model import DataStats, build_model  # lazy: matmul child: no model

    stats = DataStats(zs=ZS, e0s=[-5.0, -4.0], avg_num_neighbors=39.0, mean=0.0, std=1.0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        def factory():
            cfg = ModelConfig(use_reduced_cg=reduced_cg, **MODELS[size])
            return build_model(cfg, stats, R_MAX, seed=0)
        if for_compile:
            from mace.tools.compile import prepare

            return prepare(factory)().to(dtype)
        return factory().to(dtype)
    finally:
        torch.set_default_dtype(previous)


def cached_model(config: dict, fused: bool) -> torch.nn.Module:
    """`paper_model` for `config`, then fused if asked. The unfused model is pickled into the
    run's cache folder (if any): later configurations load it in a second instead of
    rebuilding the CG tensors; it is fused here, as loading a pickled fused model would do."""
    dtype, reduced = getattr(torch, config["dtype"]), config["cg"] == "reduced"
    size, cache = config.get("model", "paper"), config.get("cache_dir")
    path = Path(cache, f"{size}_{config['dtype']}_{config['cg']}.pt") if cache else None
    if path is not None and path.exists():
        model = torch.load(path, weights_only=False)
    else:
        model = paper_model(dtype, reduced, size=size)
        if path is not None:
            with atomic_path(path) as tmp:
                torch.save(model, tmp)
    if fused:
        # lazy: only fused runs load cfmtrain's op libraries
        from cfmtrain.kernels import fuse_model

        fuse_model(model)
    return model


def make_batch(atoms, dtype: torch.dtype) -> dict:
    from mace import data, tools
    from mace.tools import torch_geometric

    config = data.config_from_atoms(atoms)
    item = data.AtomicData.from_config(config, z_table=tools.AtomicNumberTable(ZS), cutoff=R_MAX)
    batch = next(iter(torch_geometric.dataloader.DataLoader([item], batch_size=1)))
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.to_dict().items()}


def fingerprint(tensors: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """Per tensor: [its norm, its projection on a fixed unit probe] in float64; two
    implementations of the same thing differ, relative to the norm, by at most their error."""
    result = {}
    for name, tensor in tensors.items():
        flat = tensor.detach().double().reshape(-1)
        probe = torch.sin(torch.arange(flat.numel(), dtype=torch.float64) * 0.7 + 0.3)
        projection = flat @ (probe / probe.norm()) if flat.numel() else flat.sum()
        result[name] = [float(flat.norm()), float(projection)]
    return result


def _grads(params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])


def model_pass(model: torch.nn.Module, batch: dict, kind: str,
               params: list[torch.Tensor], compiled: bool = False) -> Step:
    """forward: energy; forward_backward: energy and forces; train_step: E+F loss, Adam step.
    `params`: the model's parameters in a fixed (name) order, for the fingerprint. A `compiled`
    model takes its forces with training=True, as MACECalculator runs a compiled model: the
    graph traced for the forces' backward must be kept for the compiled function's own."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(record: bool = False) -> dict | None:
        if kind == "forward":
            with torch.no_grad():
                out = model(dict(batch), training=False, compute_force=False)
            return {"interaction_energy": out["interaction_energy"]} if record else None
        if kind == "forward_backward":
            out = model(dict(batch), training=compiled, compute_force=True)
            return {"interaction_energy": out["interaction_energy"],
                    "forces": out["forces"]} if record else None
        out = model(dict(batch), training=True, compute_force=True)
        loss = out["energy"].pow(2).mean() + 10.0 * out["forces"].pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        seen = {"loss": loss, "forces": out["forces"], "param_grads": _grads(params)} \
            if record else None
        optimizer.step()
        return seen
    return step


def _zero_grads(params: list[torch.Tensor]) -> None:
    for p in params:
        p.grad = None


def contraction_pass(modules: list, x0: torch.Tensor, y: torch.Tensor, kind: str,
                     params: list[torch.Tensor]) -> Step:
    """Both layers' symmetric contractions; train_step = force-like double backward."""
    def step(record: bool = False) -> dict | None:
        if kind == "forward":
            with torch.no_grad():
                outs = [m(x0, y) for m in modules]
            return {f"out{i}": o for i, o in enumerate(outs)} if record else None
        _zero_grads(params)
        x = x0.detach().requires_grad_(True)
        outs = [m(x, y) for m in modules]
        if kind == "forward_backward":
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        else:
            energy = sum(o.pow(2).sum() for o in outs)
            (gx,) = torch.autograd.grad(energy, x, create_graph=True)
            (energy + gx.pow(2).sum()).backward()
        if not record:
            return None
        return {**{f"out{i}": o for i, o in enumerate(outs)}, "x_grad": x.grad,
                "param_grads": _grads(params)}
    return step


def conv_pass(convs: list, inputs: list, kind: str) -> Step:
    """Both layers' convs; train_step = force-like double backward through x, Y and H."""
    def step(record: bool = False) -> dict | None:
        if kind == "forward":
            with torch.no_grad():
                outs = [conv(*args) for conv, args in zip(convs, inputs, strict=True)]
            return {f"out{i}": o for i, o in enumerate(outs)} if record else None
        leaves = [[t.detach().requires_grad_(True) for t in args] for args in inputs]
        outs = [conv(*args) for conv, args in zip(convs, leaves, strict=True)]
        flat = [t for args in leaves for t in args]
        if kind == "forward_backward":
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        else:
            energy = sum(o.pow(2).sum() for o in outs)
            grads = torch.autograd.grad(energy, flat, create_graph=True)
            (energy + sum(g.pow(2).sum() for g in grads)).backward()
        if not record:
            return None
        names = [f"{n}{i}_grad" for i in range(len(leaves)) for n in ("x", "attrs", "hidden")]
        return {**{f"out{i}": o for i, o in enumerate(outs)},
                **{n: t.grad for n, t in zip(names, flat, strict=True)}}
    return step


def conv_setup(model: torch.nn.Module, batch: dict, impl: str) -> tuple[list, list]:
    """Each interaction block's conv as the fused model runs it, a callable (x, Y, H) ->
    messages with weights H @ B (B: the radial MLP's last layer, constants folded in; a
    parameter), and its inputs: random features and hidden radial activations H, spherical
    harmonics of the batch's edge vectors. Fused: the weight rows are formed inside the kernels;
    mace-torch: one matmul, then e3nn's TensorProduct and the scatter."""
    from mace.modules.utils import get_edge_vectors_and_lengths
    from mace.tools.scatter import scatter_sum

    # lazy: only conv children (both implementations) load these op libraries
    from cfmtrain.kernels.conv import FusedChannelwiseConv
    from cfmtrain.kernels.radial import FoldedRadialMLP

    edge_index = batch["edge_index"]
    vectors, _ = get_edge_vectors_and_lengths(batch["positions"], edge_index, batch["shifts"])
    attrs = model.spherical_harmonics(vectors).detach()
    gen = torch.Generator().manual_seed(0)
    num_nodes, num_edges = batch["positions"].shape[0], edge_index.shape[1]
    convs, inputs = [], []
    for block in model.interactions:
        tp, radial = block.conv_tp, FoldedRadialMLP(block.conv_tp_weights, factored=True)
        hidden = radial.basis().shape[0]
        x = torch.randn(num_nodes, tp.irreps_in1.dim, generator=gen).to(attrs.dtype)
        h = torch.randn(num_edges, hidden, generator=gen).to(attrs.dtype)
        inputs.append([x, attrs, h])
        if impl == "fused":
            fused = FusedChannelwiseConv(tp)
            fused.factor_weights(radial)
            convs.append(lambda x, y, h, f=fused: f(x, y, h, edge_index))
            continue

        def mace_conv(x, y, h, tp=tp, radial=radial):
            messages = tp(x[edge_index[0]], y, h @ radial.basis())
            return scatter_sum(src=messages, index=edge_index[1], dim=0, dim_size=x.shape[0])
        convs.append(torch.compile(mace_conv) if impl == "compile" else mace_conv)
    return convs, inputs


def _named_params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p for _, p in sorted(model.named_parameters())]


def setup_model(config: dict, model: torch.nn.Module, batch: dict) -> tuple[Step, dict]:
    """The whole model's step for `config` (fused, mace or torch.compile)."""
    params, facts = _named_params(model), {"backend": "mace-e3nn"}
    if config["impl"] in ("fused", "fused_compile"):
        # lazy: only fused runs load cfmtrain's op libraries
        from cfmtrain.kernels import kernel_backend

        facts["backend"] = json.dumps(kernel_backend(model))
    if config["impl"] in ("compile", "fused_compile"):
        model = torch.compile(model)
        facts["backend"] = ("torch.compile of " + facts["backend"]
                            if config["impl"] == "fused_compile" else "torch.compile")
        # the compiled graph cannot turn on requires_grad of an input (forces differentiate it)
        batch = {**batch, "positions": batch["positions"].detach().requires_grad_(True)}
    compiled = config["impl"] in ("compile", "fused_compile")
    return model_pass(model, batch, config["pass"], params, compiled), facts


def setup_contraction(config: dict, model: torch.nn.Module, batch: dict) -> tuple[Step, dict]:
    """Both symmetric contractions' step, on seeded random features of the model's shape."""
    modules = [p.symmetric_contractions for p in model.products]
    params = [p for m in modules for _, p in sorted(m.named_parameters())]
    num_nodes = batch["node_attrs"].shape[0]
    facts: dict = {"backend": "mace-e3nn"}
    if config["impl"] == "fused":
        # lazy: only fused runs load cfmtrain's op libraries
        from cfmtrain.kernels.symmetric_contraction import SymmetricContractionFused

        modules = [SymmetricContractionFused(m) for m in modules]
        facts["backend"] = "cpu-fused"
    elif config["impl"] == "compile":
        modules = [torch.compile(m) for m in modules]
        facts["backend"] = "torch.compile"
    cfg = ModelConfig(**MODELS[config.get("model", "paper")])
    channels = o3.Irreps(cfg.hidden_irreps)[0].mul
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(num_nodes, channels, (cfg.max_ell + 1) ** 2, generator=gen)
    step = contraction_pass(modules, x.to(batch["positions"].dtype), batch["node_attrs"],
                            config["pass"], params)
    return step, facts


def setup(config: dict) -> tuple[Step, dict]:
    """The timed step for `config` and facts about it (edges, backend)."""
    if config["op"] == "matmul":
        return setup_matmul(config)
    dtype, impl = getattr(torch, config["dtype"]), config["impl"]
    if impl == "fused_compile" and config["op"] != "model":
        raise ValueError(f"impl fused_compile compiles the whole fused model (op model), not "
                         f"the op {config['op']!r}")
    if impl == "compile":
        model = paper_model(dtype, config["cg"] == "reduced", for_compile=True,
                            size=config.get("model", "paper"))
    elif impl == "fused_compile":
        from mace.tools.compile import disable_e3nn_codegen

        # lazy: only fused runs load cfmtrain's op libraries
        from cfmtrain.kernels import fuse_model, prepare_for_compile

        with disable_e3nn_codegen():
            model = paper_model(dtype, config["cg"] == "reduced", size=config.get("model", "paper"))
        model = prepare_for_compile(fuse_model(model))
    else:  # the fused ops are built from the model's own modules, except for the whole model
        model = cached_model(config, fused=impl == "fused" and config["op"] == "model")
    batch = make_batch(supercell(config["atoms"]), dtype)
    facts = {"edges": int(batch["edge_index"].shape[1])}
    if config["op"] == "model":
        step, more = setup_model(config, model, batch)
    elif config["op"] == "conv":
        convs, inputs = conv_setup(model, batch, impl)
        step = conv_pass(convs, inputs, config["pass"])
        more = {"backend": {"fused": "cpu-fused", "compile": "torch.compile"}.get(impl, "e3nn")}
    else:
        step, more = setup_contraction(config, model, batch)
    return step, {**facts, **more}


def setup_matmul(config: dict) -> tuple[Step, dict]:
    """The machine's matmul peak: the product of two seeded n x n matrices (2 n^3 FLOPs) on the
    fastest library the fused ops' products use for that dtype (kernels.dense: oneDNN for
    float32, where it ran 2.4x MKL's sgemm on an AMD CPU and 1.4x the AVX-512 product of
    kernels/common/gemm.h at 2048^2; torch.matmul otherwise)."""
    from cfmtrain.kernels.dense import onednn_mm  # lazy: only the matmul child loads it

    n = int(config["size"])
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(getattr(torch, config["dtype"])) for _ in "ab")
    onednn = (a.dtype == torch.float32 and torch.backends.mkldnn.is_available()
              and torch.backends.mkldnn.enabled)
    library = "oneDNN matmul" if onednn else "torch.matmul"

    def step(record: bool = False) -> dict | None:
        out = onednn_mm(a, b) if onednn else a @ b
        return {"out": out} if record else None
    return step, {"flops": 2 * n**3, "backend": f"{library} {n}x{n}"}


def time_step(step: Step, reps: int) -> dict:
    """First call (compile/warm-up, and the fingerprint) timed apart, `WARMUP_CALLS` untimed
    ones, then `reps` timed calls (wall and process CPU seconds)."""
    start = time.perf_counter()
    seen = step(True)
    first = time.perf_counter() - start
    prints = fingerprint(seen or {})
    for _ in range(WARMUP_CALLS):
        step(False)
    times, cpu_times = [], []
    for _ in range(reps):
        start, cpu_start = time.perf_counter(), time.process_time()
        step(False)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    # CPU seconds (all threads) are recorded too: on a shared machine they move less than wall
    return {"median_s": statistics.median(times), "min_s": min(times), "times": times,
            "median_cpu_s": statistics.median(cpu_times), "compile_s": first,
            "fingerprint": prints}


def main(config: dict) -> int:
    """Run `config`; print one JSON line (status ok / oom / error) and return 0."""
    result: dict = {"threads": torch.get_num_threads(),
                    "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
                    "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "")}
    try:
        step, facts = setup(config)
        result.update(facts)
        result.update(time_step(step, config["reps"]))
        if config["impl"] == "fused":  # counted on one more, untimed, call
            result["flops"] = count_flops(lambda: step(False))
        result["status"] = "ok"
    except Exception as error:  # any failure is a result of the benchmark, recorded as such
        text = f"{type(error).__name__}: {error}"
        oom = isinstance(error, MemoryError) or any(m in text for m in OOM_MARKERS)
        result["status"] = "oom" if oom else "error: " + (text.splitlines() or [""])[0][:200]
        traceback.print_exc()
    print(json.dumps(result), flush=True)
    return 0
