"""The pure-PyTorch evaluator of sparse polynomials (kernels/reference.py) against the compiled
op, and the "reference" backend (our fused contraction on it) against mace-torch and cpu-fused."""

from __future__ import annotations

import copy

import mace  # noqa: F401  (import mace before e3nn)
import pytest
import torch
from helpers import (  # noqa: F401  (small_and_serial: autouse, one thread, no e3nn TorchScript)
    atoms,
    batch_dict,
    energy_forces_grads,
    rel_err,
    small_and_serial,
    small_model,
)
from mace import modules
from mace.modules.symmetric_contraction import SymmetricContraction
from torch.utils._python_dispatch import TorchDispatchMode

from cfmtrain.kernels import fuse_model, kernel_backend, unfuse_model
from cfmtrain.kernels.reference import evaluate_reference
from cfmtrain.kernels.sparse_polynomial import Descriptor, evaluate, merged_terms
from cfmtrain.kernels.symmetric_contraction import SymmetricContractionFused

REFERENCE = {"symmetric_contraction": "reference", "conv": "mace"}


def random_problem(seed: int, out_per_elem: bool, dtype=torch.float64, channels=3,
                   num_rows: int = 7, num_elems: int = 3):
    """A random descriptor (1 to 5 factors a term, repeated factors, a per-element operand) and
    operands for it: (desc, operands, elem, num_rows, num_elems)."""
    gen = torch.Generator().manual_seed(seed)
    dims, per_elem = [4, 3, 5], [False, True, False]
    num_out = 4

    def randint(high: int) -> int:
        return int(torch.randint(high, (), generator=gen))

    items = []
    for _ in range(40):
        factors = []
        for _ in range(1 + randint(5)):
            op = randint(len(dims))
            factors.append((op, randint(dims[op])))
        items.append((randint(num_out), tuple(factors), float(torch.randn((), generator=gen))))
    items.append((0, ((0, 1), (0, 1), (0, 1)), 0.5))  # a cube: repeated factors
    desc = Descriptor(dims, per_elem, num_out, out_per_elem, merged_terms(items))
    operands = [torch.randn(num_elems if e else num_rows, d, channels, generator=gen, dtype=dtype)
                for d, e in zip(dims, per_elem, strict=True)]
    elem = torch.randint(num_elems, (num_rows,), generator=gen)
    elem[:num_elems] = torch.arange(num_elems)  # every element present
    return desc, operands, elem, num_rows, num_elems


def derivatives(fn, operands: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """fn(operands), its gradients against a random cotangent, and their gradients against
    random directions (second derivatives), every one materialised."""
    gen = torch.Generator().manual_seed(seed)
    leaves = [x.detach().clone().requires_grad_() for x in operands]
    out = fn(leaves)
    cotangent = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    firsts = torch.autograd.grad((out * cotangent).sum(), leaves, create_graph=True)
    directions = [torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in leaves]
    inner = sum((g * v).sum() for g, v in zip(firsts, directions, strict=True))
    seconds = torch.autograd.grad(inner, leaves, allow_unused=True)
    seconds = [torch.zeros_like(x) if s is None else s for s, x in zip(seconds, leaves,
                                                                       strict=True)]
    return [out.detach(), *(g.detach() for g in firsts), *seconds]


@pytest.mark.parametrize("out_per_elem", [False, True], ids=["per-node-out", "per-elem-out"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_evaluator_matches_compiled_op_to_second_order(seed, out_per_elem):
    desc, operands, elem, num_rows, num_elems = random_problem(seed, out_per_elem)
    assert {len(f) for _, f, _ in desc.terms} >= {1, 2, 3}

    def compiled(xs):
        return evaluate(desc, xs, elem, num_rows, num_elems)

    def reference(xs):
        return evaluate_reference(desc, xs, elem, num_rows, num_elems)

    got, expected = derivatives(reference, operands, seed), derivatives(compiled, operands, seed)
    assert got[0].shape == (num_elems if out_per_elem else num_rows, desc.num_out, 3)
    for g, e in zip(got, expected, strict=True):
        assert e.abs().max() > 0
        assert rel_err(g, e) < 1e-13


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_op_many_nodes_per_element_every_channel_block(dtype):
    """The kernel sums up to 8 nodes of one element at a time (per-element output) and splits
    channels into blocks of 8, 4 and 1 vectors and a scalar tail: 45 nodes in unsorted order, an
    element with no node, 117 channels (every block kind in float32 and float64), to second
    order."""
    desc, operands, elem, num_rows, num_elems = random_problem(
        4, True, dtype, channels=117, num_rows=45, num_elems=4)
    elem = torch.randint(3, (num_rows,), generator=torch.Generator().manual_seed(5))
    elem[elem == 1] = 3  # element 1 has no node; 0, 2 and 3 have more than 8 each
    assert all(int((elem == e).sum()) > 8 for e in (0, 2, 3))
    got = derivatives(lambda xs: evaluate(desc, xs, elem, num_rows, num_elems), operands, 4)
    expected = derivatives(lambda xs: evaluate_reference(desc, xs, elem, num_rows, num_elems),
                           operands, 4)
    assert bool((got[0][1] == 0).all())  # the absent element's rows
    for g, e in zip(got, expected, strict=True):
        assert e.abs().max() > 0
        assert rel_err(g, e) < (1e-13 if dtype == torch.float64 else 1e-5)


def test_evaluator_float32_matches_compiled_op():
    desc, operands, elem, num_rows, num_elems = random_problem(3, False, torch.float32, 17)
    got = evaluate_reference(desc, operands, elem, num_rows, num_elems)
    expected = evaluate(desc, operands, elem, num_rows, num_elems)
    assert got.dtype == torch.float32
    assert rel_err(got, expected) < 1e-5


def test_evaluator_gradcheck_and_gradgradcheck():
    desc, operands, elem, num_rows, num_elems = random_problem(4, True, channels=2)
    leaves = tuple(x.detach().clone().requires_grad_() for x in operands)

    def fn(*xs):
        return evaluate_reference(desc, xs, elem, num_rows, num_elems)

    assert torch.autograd.gradcheck(fn, leaves)
    assert torch.autograd.gradgradcheck(fn, leaves)


def test_evaluator_brute_force_and_any_device():
    # out[n, 0] = 2 x[n, 0] x[n, 1] w[elem[n], 2];  out[n, 1] = -x[n, 1]^2
    desc = Descriptor([2, 3], [False, True], 2, False, merged_terms(
        [(0, ((0, 0), (0, 1), (1, 2)), 2.0), (1, ((0, 1), (0, 1)), -1.0)]))
    x, w = torch.randn(5, 2, 4, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    elem = torch.tensor([0, 1, 1, 0, 1])
    out = evaluate_reference(desc, [x, w], elem, 5)
    assert torch.equal(out[:, 0], 2 * x[:, 0] * x[:, 1] * w[elem, 2])
    assert torch.equal(out[:, 1], -x[:, 1] ** 2)
    meta = evaluate_reference(desc, [x.to("meta"), w.to("meta")], elem.to("meta"), 5)
    assert meta.device.type == "meta" and meta.shape == (5, 2, 4)


def test_evaluator_rejects_bad_arguments():
    desc, operands, elem, num_rows, num_elems = random_problem(5, False)
    with pytest.raises(ValueError, match="takes 3 operands"):
        evaluate_reference(desc, operands[:2], elem, num_rows, num_elems)
    with pytest.raises(ValueError, match="`elem` is required"):
        evaluate_reference(desc, operands, None, num_rows, num_elems)
    with pytest.raises(ValueError, match="per node"):
        evaluate_reference(desc, [operands[0][:5], *operands[1:]], elem, num_rows, num_elems)


class CalledOps(TorchDispatchMode):
    """Records the namespaces of the ops dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.namespaces: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.namespaces.add(func.namespace)
        return func(*args, **(kwargs or {}))


def namespaces_called(model, batch) -> set[str]:
    with CalledOps() as called:
        energy_forces_grads(model, batch)
    return called.namespaces


@pytest.mark.parametrize("case", [(modules.MACE, False, "8x0e+8x1o", 2),
                                  (modules.ScaleShiftMACE, True, "6x0e+6x1o+6x2e", 3)],
                         ids=["mace", "scaleshift-reduced-2e"])
def test_reference_model_matches_mace_and_cpu_fused_float64(case):
    model = small_model(*case)
    batch = batch_dict(atoms())
    expected = energy_forces_grads(model, batch)
    cpu_fused = fuse_model(copy.deepcopy(model), conv=False, backend="cpu-fused")
    assert fuse_model(model, backend="reference") is model
    assert kernel_backend(model) == REFERENCE
    assert all(isinstance(p.symmetric_contractions, SymmetricContractionFused)
               and p.symmetric_contractions.backend == "reference" for p in model.products)
    got = energy_forces_grads(model, batch)
    for g, e, c in zip(got, expected, energy_forces_grads(cpu_fused, batch), strict=True):
        assert rel_err(g, e) < 1e-10
        assert rel_err(g, c) < 1e-10
    # the reference model runs no compiled cfmtrain op; the cpu-fused one does (the check works)
    assert "cfmtrain" not in namespaces_called(model, batch)
    assert "cfmtrain" in namespaces_called(cpu_fused, batch)


def test_reference_backend_switches_pickles_and_unfuses():
    model = small_model()
    originals = [p.symmetric_contractions for p in model.products]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = dict(model.named_parameters())
    fuse_model(model, backend="reference")
    fused = [p.symmetric_contractions for p in model.products]
    fuse_model(model, backend="reference")  # idempotent: the same modules
    assert [p.symmetric_contractions for p in model.products] == fused
    assert list(model.state_dict()) == list(state)
    assert all(p is params[name] for name, p in model.named_parameters())
    copied = copy.deepcopy(model)  # pickling's __reduce__ keeps the backend
    assert kernel_backend(copied) == REFERENCE
    assert all(p.symmetric_contractions.backend == "reference" for p in copied.products)
    fuse_model(model, conv=False, backend="cpu-fused")
    assert all(p.symmetric_contractions.backend == "cpu-fused" for p in model.products)
    assert kernel_backend(model) == {"symmetric_contraction": "cpu-fused", "conv": "mace"}
    fuse_model(model, backend="reference")
    assert all(p.symmetric_contractions.backend == "reference" for p in model.products)
    unfuse_model(model)
    assert kernel_backend(model) == {}
    for product, original in zip(model.products, originals, strict=True):
        assert product.symmetric_contractions is original
        assert type(original) is SymmetricContraction
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key])


def test_rejects_an_unknown_fused_backend():
    with pytest.raises(ValueError, match="no fused contraction for backend 'cueq'"):
        SymmetricContractionFused(small_model().products[0].symmetric_contractions, "cueq")
