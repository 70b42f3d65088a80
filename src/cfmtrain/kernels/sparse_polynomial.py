"""Sparse polynomials over channel-contiguous operands, their derivative descriptors, and the
compiled `cfmtrain::sparse_polynomial*` ops with fake and autograd registrations.

A term adds `coeff * prod_f operand[op_f][row, comp_f, :]` to `out[row', out, :]`; an operand's
row is the node, or `elem[node]` for per-element operands (weights chosen by element index).
The derivative w.r.t. an operand, contracted with the output's cotangent, is again such a
polynomial (one extra operand: the cotangent), so every order of derivative runs one kernel.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.flop_counter import register_flop_formula

from cfmtrain.kernels.backend import compiled_ops, ops_built

# the ops raise at their first call where the library is not built
_OPS = compiled_ops("cfmtrain._ops_symmetric_contraction")

Factor = tuple[int, int]  # (operand, component)

_REGISTRY: dict[int, Descriptor] = {}


class Descriptor:
    """Terms of a sparse polynomial with operand and output shapes; derivatives are cached."""

    def __init__(
        self,
        operand_dims: Sequence[int],
        operand_per_elem: Sequence[bool],
        num_out: int,
        out_per_elem: bool,
        terms: dict[tuple[int, tuple[Factor, ...]], float],
    ) -> None:
        self.operand_dims = tuple(int(d) for d in operand_dims)
        self.operand_per_elem = tuple(bool(p) for p in operand_per_elem)
        if len(self.operand_dims) != len(self.operand_per_elem):
            raise ValueError("operand_dims and operand_per_elem differ in length")
        self.num_out = int(num_out)
        self.out_per_elem = bool(out_per_elem)
        # Terms with the same output and factors are merged; exact zeros (cancellations) dropped.
        items = sorted((k, c) for k, c in terms.items() if c != 0.0)
        self.terms: tuple[tuple[int, tuple[Factor, ...], float], ...] = tuple(
            (out, factors, float(c)) for (out, factors), c in items
        )
        self._check()
        self._pack()
        self._derivatives: dict[int, Descriptor] = {}
        self.id = self._content_id()
        _REGISTRY.setdefault(self.id, self)

    def _check(self) -> None:
        for out, factors, _ in self.terms:
            if not 1 <= len(factors) <= 16:
                raise ValueError(f"a term needs 1 to 16 factors, got {len(factors)}")
            if not 0 <= out < self.num_out:
                raise ValueError(f"term output {out} outside [0, {self.num_out})")
            for op, comp in factors:
                if not (0 <= op < len(self.operand_dims) and 0 <= comp < self.operand_dims[op]):
                    raise ValueError(f"factor {(op, comp)} outside the operands' shapes")

    def _pack(self) -> None:
        # real tensors even when made while torch.compile traces (a derivative's descriptor
        # is first needed there): a cached fake tensor would meet the next trace's fake mode
        with _disable_current_modes():
            self._pack_tensors()

    def _pack_tensors(self) -> None:
        counts = [len(f) for _, f, _ in self.terms]
        flat = [factor for _, factors, _ in self.terms for factor in factors]
        self.term_out = torch.tensor([t[0] for t in self.terms], dtype=torch.int64)
        self.term_coeff = torch.tensor([t[2] for t in self.terms], dtype=torch.float64)
        self.factor_ptr = torch.tensor(np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]))
        self.factor_op = torch.tensor([f[0] for f in flat], dtype=torch.int64)
        self.factor_comp = torch.tensor([f[1] for f in flat], dtype=torch.int64)

    def _content_id(self) -> int:
        digest = hashlib.blake2b(digest_size=8)
        digest.update(repr((self.operand_dims, self.operand_per_elem, self.num_out,
                            self.out_per_elem, self.terms)).encode())
        return int.from_bytes(digest.digest(), "little") & ((1 << 62) - 1)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_derivatives"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        _REGISTRY.setdefault(self.id, self)

    @property
    def num_terms(self) -> int:
        return len(self.terms)

    @property
    def num_factors(self) -> int:
        return int(self.factor_op.numel())

    def derivative(self, operand: int) -> Descriptor:
        """d(out)/d(operand) contracted with the output cotangent, appended as a last operand.

        The result has output shape of `operand` and operands `(*self.operands, cotangent)`.
        """
        if operand not in self._derivatives:
            cotangent = len(self.operand_dims)
            terms: dict[tuple[int, tuple[Factor, ...]], float] = defaultdict(float)
            for out, factors, coeff in self.terms:
                for pos, (op, comp) in enumerate(factors):
                    if op != operand:
                        continue
                    rest = factors[:pos] + factors[pos + 1:] + ((cotangent, out),)
                    terms[(comp, tuple(sorted(rest)))] += coeff
            self._derivatives[operand] = Descriptor(
                (*self.operand_dims, self.num_out),
                (*self.operand_per_elem, self.out_per_elem),
                self.operand_dims[operand],
                self.operand_per_elem[operand],
                terms,
            )
        return self._derivatives[operand]

    @staticmethod
    def from_op_args(operands: Sequence[torch.Tensor], per_elem: Sequence[int],
                     term_out: torch.Tensor, term_coeff: torch.Tensor, factor_ptr: torch.Tensor,
                     factor_op: torch.Tensor, factor_comp: torch.Tensor, num_out: int,
                     out_per_elem: bool) -> Descriptor:
        """Rebuild a descriptor from an op call's arguments (when it is not in the registry)."""
        ptr = factor_ptr.tolist()
        ops, comps = factor_op.tolist(), factor_comp.tolist()
        terms: dict[tuple[int, tuple[Factor, ...]], float] = defaultdict(float)
        pairs = zip(term_out.tolist(), term_coeff.tolist(), strict=True)
        for t, (out, coeff) in enumerate(pairs):
            span = slice(ptr[t], ptr[t + 1])
            factors = tuple(sorted(zip(ops[span], comps[span], strict=True)))
            terms[(out, factors)] += coeff
        dims = [int(x.shape[1]) for x in operands]
        return Descriptor(dims, [bool(p) for p in per_elem], num_out, out_per_elem, terms)


def _lookup(desc_id: int, args: Sequence) -> Descriptor:
    desc = _REGISTRY.get(desc_id)
    if desc is None:
        operands, per_elem, _, t_out, t_coeff, f_ptr, f_op, f_comp, num_out = args[:9]
        desc = Descriptor.from_op_args(operands, per_elem, t_out, t_coeff, f_ptr, f_op, f_comp,
                                       num_out, args[11])
        _REGISTRY[desc_id] = desc
    return desc


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_FORWARD = _OPS.sparse_polynomial
_BACKWARD = _OPS.sparse_polynomial_backward
_DOUBLE_BACKWARD = _OPS.sparse_polynomial_double_backward
_NEXT_ORDER = {"sparse_polynomial": _BACKWARD, "sparse_polynomial_backward": _DOUBLE_BACKWARD,
               "sparse_polynomial_double_backward": _DOUBLE_BACKWARD}


def evaluate(desc: Descriptor, operands: Sequence[torch.Tensor], elem: torch.Tensor | None,
             num_rows: int, num_elems: int = 0, op=_FORWARD) -> torch.Tensor:
    """Evaluate `desc` on `operands` (each (rows, dim, C), contiguous): (rows_out, num_out, C)."""
    if len(operands) != len(desc.operand_dims):
        raise ValueError(f"descriptor takes {len(desc.operand_dims)} operands, got {len(operands)}")
    packed = (desc.term_out, desc.term_coeff, desc.factor_ptr, desc.factor_op, desc.factor_comp)
    if any(type(t) not in _PLAIN for t in operands):
        # traced by AOT autograd (a compiled backward, opcheck: fake or functional operands):
        # the descriptor's tensors become constants made in the trace, as real tensors may not
        # meet fake ones in one call (dynamo, which sees plain tensors, lifts the real ones)
        packed = tuple(torch.tensor(t.tolist(), dtype=t.dtype) for t in packed)
    return op(list(operands), [int(p) for p in desc.operand_per_elem], elem, *packed,
              desc.num_out, num_rows, num_elems, desc.out_per_elem, desc.id)


def _fake(operands, operand_per_elem, elem, term_out, term_coeff, factor_ptr, factor_op,
          factor_comp, num_out, num_rows, num_elems, out_per_elem, desc_id):
    rows = num_elems if out_per_elem else num_rows
    return operands[0].new_empty((rows, num_out, operands[0].shape[2]))


def _setup_context(ctx, inputs, output) -> None:
    operands, elem = inputs[0], inputs[2]
    ctx.num_operands = len(operands)
    ctx.has_elem = elem is not None
    ctx.args = inputs[:2] + (None,) + tuple(inputs[3:])  # descriptor tensors and sizes
    ctx.save_for_backward(*operands, *([elem] if elem is not None else []))


def _engine_uses(t: torch.Tensor) -> bool:
    """Whether the running backward pass will use a gradient for `t`.

    `needs_input_grad` only says that `t` requires grad; `autograd.grad(E, x)` (forces) does not
    need the weights' gradient, which would cost as much as the forward pass.
    """
    try:
        node = torch.autograd.graph._get_grad_fn_or_grad_acc(t)
        return node is None or bool(torch._C._will_engine_execute_node(node))
    except (RuntimeError, AttributeError):  # outside the engine (e.g. functorch): be safe
        return True


def _make_backward(next_op) -> callable:
    def backward(ctx, grad: torch.Tensor):
        saved = ctx.saved_tensors
        operands = list(saved[:ctx.num_operands])
        elem = saved[ctx.num_operands] if ctx.has_elem else None
        desc = _lookup(ctx.args[-1], (operands, *ctx.args[1:]))
        num_rows, num_elems = ctx.args[9], ctx.args[10]
        grads = []
        for j, needed in enumerate(ctx.needs_input_grad[0]):
            if not needed or not _engine_uses(operands[j]):
                grads.append(None)
                continue
            d = desc.derivative(j)
            rows = num_elems if d.out_per_elem else num_rows
            if d.num_terms == 0:
                grads.append(operands[j].new_zeros((rows, d.num_out, operands[j].shape[2])))
                continue
            grads.append(evaluate(d, [*operands, grad.contiguous()], elem, num_rows, num_elems,
                                  op=next_op))
        return (grads,) + (None,) * 12
    return backward


def _flops(operands, operand_per_elem, elem, term_out, term_coeff, factor_ptr, factor_op,
           factor_comp, num_out, num_rows, num_elems, out_per_elem, desc_id, out_val=None) -> int:
    """FLOPs the kernel executes (torch.utils.flop_counter): per row and channel, one multiply
    per factor (the coefficient rides on the first) and one add per term."""
    return int(num_rows) * int(operands[0].shape[2]) * (factor_op.numel() + term_out.numel())


for _name, _op in (("sparse_polynomial", _FORWARD), ("sparse_polynomial_backward", _BACKWARD),
                   ("sparse_polynomial_double_backward", _DOUBLE_BACKWARD)):
    if not ops_built(_OPS):
        break
    torch.library.register_fake(f"cfmtrain::{_name}")(_fake)
    torch.library.register_autograd(f"cfmtrain::{_name}", _make_backward(_NEXT_ORDER[_name]),
                                    setup_context=_setup_context)
    register_flop_formula(_op, get_raw=True)(_flops)


def merged_terms(items: Iterable[tuple[int, tuple[Factor, ...], float]]) -> dict:
    """Sum coefficients of terms with equal output and (sorted) factors."""
    terms: dict[tuple[int, tuple[Factor, ...]], float] = defaultdict(float)
    for out, factors, coeff in items:
        terms[(out, tuple(sorted(factors)))] += coeff
    return terms
