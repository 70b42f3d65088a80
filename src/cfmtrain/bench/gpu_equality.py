"""The equality checks of `cfmtrain bench gpu`: both paper kernels through cuEquivariance against
mace-torch's e3nn code on one device, in float64.

The channelwise conv (with its gather and scatter) on the kernel tests' conv shapes
(kernels.shapes), to second derivatives; the symmetric contraction on their contraction shapes,
its value and gradients; whole models: energies, forces, stress and every parameter gradient of a
loss of all three. Tolerances are the tests' (tests/kernels/test_cueq.py). The checks run with
float64 as torch's default dtype, as the tests do: cuEquivariance's PyTorch fallback makes some
of its constants in the default dtype, which cost float32's rounding (2e-8) on a float64 conv.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import mace.modules  # noqa: F401  (before e3nn)
import torch
from e3nn import o3

from cfmtrain.bench.kernels_worker import make_batch, paper_model, supercell
from cfmtrain.kernels.shapes import CONV_SHAPES, SC_SHAPES

# cuEquivariance's PyTorch fallback builds a correlation-3 contraction in 20-40 s (its FX
# graph), its CUDA kernel in a moment: off the GPU only the others are checked
FALLBACK_MAX_CORRELATION = 2
CONV_TOLERANCE = 1e-10
SC_TOLERANCE = 1e-6  # cuet's basis reaches mace's by a projection mace checks to 1e-7
MODEL_TOLERANCE = 1e-6


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b| (the tests' measure)."""
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / scale if scale > 0 else a.abs().max().item()


def _float64(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return build()
    finally:
        torch.set_default_dtype(previous)


def make_tp(hidden: str, lmax: int) -> torch.nn.Module:
    """The conv_tp MACE builds for node features `hidden` and spherical harmonics to lmax."""
    from mace.modules.irreps_tools import tp_out_irreps_with_instructions
    from mace.modules.wrapper_ops import TensorProduct

    irreps_in, sh = o3.Irreps(hidden), o3.Irreps.spherical_harmonics(lmax)
    mid, instructions = tp_out_irreps_with_instructions(irreps_in, sh, sh.sort()[0].simplify())
    return _float64(lambda: TensorProduct(irreps_in, sh, mid, instructions=instructions,
                                          shared_weights=False, internal_weights=False))


def _derivatives(f: Callable, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Output, the VJP of a seeded cotangent (with its graph), and the gradient of its square."""
    out = f(*inputs)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(1),
                      dtype=out.dtype).to(out.device)
    grads = torch.autograd.grad((out * cot).sum(), inputs, create_graph=True)
    second = torch.autograd.grad(sum((g**2).sum() for g in grads), inputs)
    return [out, *grads, *second]


def conv_error(hidden: str, lmax: int, device: torch.device) -> float:
    """Largest relative difference of the cuEquivariance conv from mace-torch's e3nn product
    followed by scatter_sum, over its output and derivatives to second order."""
    from mace.tools.scatter import scatter_sum

    from cfmtrain.kernels.cueq import ChannelwiseConvCueq

    tp = make_tp(hidden, lmax).to(device)
    gen = torch.Generator().manual_seed(3)
    edge_index = torch.randint(0, 9, (2, 40), generator=gen).to(device)
    inputs = [torch.randn(shape, generator=gen, dtype=torch.float64).to(device).requires_grad_()
              for shape in ((9, tp.irreps_in1.dim), (40, tp.irreps_in2.dim),
                            (40, tp.weight_numel))]
    conv = ChannelwiseConvCueq(copy.deepcopy(tp))

    def e3nn(x, y, w):
        return scatter_sum(tp(x[edge_index[0]], y, w), edge_index[1], dim=0, dim_size=9)

    ours = _derivatives(lambda x, y, w: conv(x, y, w, edge_index), inputs)
    return max(rel_err(a, b) for a, b in zip(ours, _derivatives(e3nn, inputs), strict=True))


def sc_error(shape: tuple, device: torch.device) -> float:
    """Largest relative difference of the cuEquivariance contraction from mace-torch's, over its
    output and the gradients of a seeded cotangent for the input and every weight."""
    from mace.modules.symmetric_contraction import SymmetricContraction

    from cfmtrain.kernels.cueq import SymmetricContractionCueq, cueq_method

    lmax, correlation, out, elements, channels, reduced = shape
    irreps_in = o3.Irreps("+".join(f"{channels}x{ell}{'eo'[ell % 2]}" for ell in range(lmax + 1)))
    irreps_out = o3.Irreps("+".join(f"{channels}x{ir}" for ir in out.split("+")))
    sc = _float64(lambda: SymmetricContraction(irreps_in, irreps_out, correlation=correlation,
                                               num_elements=elements, use_reduced_cg=reduced))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in sc.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    sc = sc.to(device)
    num_ell = sum(mul_ir.ir.dim for mul_ir in sc.irreps_in)
    x = torch.randn(7, channels, num_ell, generator=gen, dtype=torch.float64).to(device)
    kinds = torch.randint(0, elements, (7,), generator=gen)
    y = torch.nn.functional.one_hot(kinds, elements).to(torch.float64).to(device)
    x.requires_grad_()
    cueq = SymmetricContractionCueq(sc, method=cueq_method(device))

    def value_and_grads(f):
        out = f(x, y)
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(5),
                          dtype=out.dtype).to(device)
        params = [x, *sc.parameters()]
        grads = torch.autograd.grad((out * cot).sum(), params, allow_unused=True)
        return [out, *(torch.zeros_like(p) if g is None else g
                       for g, p in zip(grads, params, strict=True))]

    return max(rel_err(a, b) for a, b in zip(value_and_grads(cueq), value_and_grads(sc),
                                             strict=True))


def everything(model: torch.nn.Module, batch: dict) -> list[torch.Tensor]:
    """Energy, forces, stress and the parameter gradients of an energy+forces+stress loss."""
    out = model(dict(batch), training=True, compute_force=True, compute_stress=True)
    loss = out["energy"].pow(2).sum() + out["forces"].pow(2).sum() + out["stress"].pow(2).sum()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [out["energy"].detach(), out["forces"].detach(), out["stress"].detach(),
            *(torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True))]


def model_errors(size: str, reduced: bool, atoms: int, device: torch.device
                 ) -> dict[str, float]:
    """The project's model (`size`: paper or tiny) on a rattled Cu-Ni supercell, both kernels
    through cuEquivariance against its e3nn self: the largest relative difference of the
    energy, the forces, the stress and the parameter gradients."""
    from cfmtrain.kernels import fuse_model, kernel_backend

    model = paper_model(torch.float64, reduced, size=size).to(device)
    batch = {k: v.to(device) for k, v in make_batch(supercell(atoms), torch.float64).items()}
    truth = everything(model, batch)
    fuse_model(model, backend="cueq")
    if kernel_backend(model) != {"symmetric_contraction": "cueq", "conv": "cueq"}:
        raise RuntimeError(f"fuse_model gave {kernel_backend(model)}, not cuEquivariance")
    got = everything(model, batch)
    errors = [rel_err(a, b) for a, b in zip(got, truth, strict=True)]
    return {"energy": errors[0], "forces": errors[1], "stress": errors[2],
            "parameter gradients": max(errors[3:])}


def equality_rows(device: torch.device, full: bool, size: str, atoms: int) -> list[dict]:
    """One row per check: its name, largest relative error, tolerance and verdict. `full`: every
    contraction shape (else those the CPU fallback builds quickly); the model at `size`
    in both CG bases."""
    rows = []
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _checks(rows, device, full, size, atoms)
    finally:
        torch.set_default_dtype(previous)
    return rows


def _checks(rows: list[dict], device: torch.device, full: bool, size: str, atoms: int) -> None:
    def add(name: str, error: float, tolerance: float) -> None:
        rows.append({"kind": "equality", "check": name, "max_rel_err": error,
                     "tolerance": tolerance, "ok": bool(error < tolerance)})
        print(f"{name}: {error:.2e} (< {tolerance:g}: {'ok' if error < tolerance else 'FAILED'})",
              flush=True)

    for hidden, lmax in CONV_SHAPES:
        add(f"conv {hidden} lmax {lmax}", conv_error(hidden, lmax, device), CONV_TOLERANCE)
    for shape in SC_SHAPES:
        if full or shape[1] <= FALLBACK_MAX_CORRELATION:
            lmax, correlation, out, elements, channels, reduced = shape
            name = (f"contraction lmax {lmax} correlation {correlation} {out} ({elements} "
                    f"elements, {channels} channels{', reduced CG' if reduced else ''})")
            add(name, sc_error(shape, device), SC_TOLERANCE)
    for reduced in (False, True):
        errors = model_errors(size, reduced, atoms, device)
        for output, error in errors.items():
            add(f"{size} model{' reduced CG' if reduced else ''}, {atoms} atoms: {output}",
                error, MODEL_TOLERANCE)
