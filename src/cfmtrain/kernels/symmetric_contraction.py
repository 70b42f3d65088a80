"""MACE's symmetric contraction as sparse polynomials on the compiled `cfmtrain` ops (or on the
pure-PyTorch evaluator, kernels/reference.py, for the "reference" backend).

Descriptors are built once from mace's generalized CG (U) tensors; the fused module replaces a
mace `SymmetricContraction` while sharing its parameters (state_dict keys unchanged).
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import torch
from e3nn import o3

from cfmtrain.kernels.backend import CPU_FUSED, REFERENCE
from cfmtrain.kernels.reference import evaluate_reference
from cfmtrain.kernels.sparse_polynomial import Descriptor, evaluate

_EVALUATORS = {CPU_FUSED: evaluate, REFERENCE: evaluate_reference}

# A symmetrised U entry below this fraction of the largest |U| is a cancellation residue.
_ZERO_TOL = 1e-10


@functools.lru_cache(maxsize=64)
def _u_matrix_float64(coupling: str, irrep_out: str, nu: int, reduced: bool) -> torch.Tensor:
    from mace.tools.cg import U_matrix_real

    return U_matrix_real(irreps_in=o3.Irreps(coupling), irreps_out=o3.Irreps(irrep_out),
                         correlation=nu, use_cueq_cg=reduced, dtype=torch.float64)[-1]


def u_matrix_float64(contraction: torch.nn.Module, irrep_out: o3.Irrep, nu: int) -> torch.Tensor:
    """The U tensor of `contraction` for degree `nu` in float64.

    A float32 model's buffer is matched against both CG bases recomputed in float64 (the module
    does not record which basis built it), so the fused path carries float64 coefficients.
    """
    buffer = contraction.U_tensors(nu).detach().cpu()
    if buffer.dtype == torch.float64:
        return buffer
    scale = float(buffer.abs().max()) or 1.0
    for reduced in (True, False):
        candidate = _u_matrix_float64(str(contraction.coupling_irreps), str(irrep_out), nu, reduced)
        if candidate.shape == buffer.shape and torch.allclose(
            candidate.to(buffer.dtype), buffer, rtol=1e-5, atol=1e-6 * scale
        ):
            return candidate
    warnings.warn(f"U_matrix_{nu} of a {irrep_out} contraction matches neither CG basis; "
                  "using its float32 values", stacklevel=2)
    return buffer.double()


def symmetrized_terms(u: np.ndarray, nu: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-zero U entries merged over index permutations.

    `u` is (dim_out, L, ..., L, P). Returns `keys` (M, 1 + nu + 1) rows (w, i_1 <= .. <= i_nu, p)
    and their coefficients (M,): sum over the permutations of (i_1..i_nu) of U.
    """
    idx = np.argwhere(u != 0)
    vals = u[tuple(idx.T)]
    keys = np.column_stack([idx[:, :1], np.sort(idx[:, 1:1 + nu], axis=1), idx[:, -1:]])
    if len(keys) == 0:
        return keys.reshape(0, nu + 2), vals
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=vals, minlength=len(uniq))
    keep = np.abs(sums) > _ZERO_TOL * np.abs(vals).max()
    return uniq[keep], sums[keep]


class ContractionDescriptors:
    """Descriptors of one mace SymmetricContraction.

    `weights`: (params of every (irrep, nu) weight tensor) -> per-element term weights Wt;
    `forward`: (x (N, L, C), Wt (E, T, C) per element) -> out (N, K, C), K = sum of irrep dims.
    """

    def __init__(self, sc: torch.nn.Module) -> None:
        self.irrep_dims: list[int] = []
        self.weight_slots: list[tuple[int, int]] = []  # (contraction index, nu) per operand
        weight_dims: list[int] = []
        forward_terms: dict = {}
        weight_terms: dict = {}
        num_terms = offset = 0
        num_ell = None
        for j, (contraction, mul_ir) in enumerate(zip(sc.contractions, sc.irreps_out, strict=True)):
            dim = mul_ir.ir.dim
            for nu in range(1, contraction.correlation + 1):
                u = u_matrix_float64(contraction, mul_ir.ir, nu)
                if u.dim() == nu + 1:  # scalar outputs carry no leading component axis
                    u = u.unsqueeze(0)
                num_ell = u.shape[1]
                keys, coeffs = symmetrized_terms(u.numpy(), nu)
                slot = len(weight_dims)
                self.weight_slots.append((j, nu))
                weight_dims.append(u.shape[-1])
                monomials, term_of = np.unique(keys[:, :-1], axis=0, return_inverse=True)
                for w, *ells in monomials.tolist():
                    factors = tuple(sorted([(0, i) for i in ells] + [(1, num_terms)]))
                    forward_terms[(offset + w, factors)] = 1.0
                    num_terms += 1
                base = num_terms - len(monomials)
                rows = zip(term_of.ravel().tolist(), keys[:, -1].tolist(), coeffs, strict=True)
                for t, p, c in rows:
                    weight_terms[(base + t, ((slot, p),))] = float(c)
            self.irrep_dims.append(dim)
            offset += dim
        if num_ell is None:
            raise ValueError("symmetric contraction has no output irreps")
        self.num_ell, self.num_out, self.num_terms = num_ell, offset, num_terms
        self.weights = Descriptor(weight_dims, [False] * len(weight_dims), num_terms, False,
                                  weight_terms)
        self.forward = Descriptor([num_ell, num_terms], [False, True], offset, False,
                                  forward_terms)


def element_index(node_attrs: torch.Tensor) -> torch.Tensor:
    """Per-node element index of one-hot `node_attrs` (N, E); raises if they are not one-hot."""
    if node_attrs.dim() != 2:
        raise ValueError(f"node_attrs must be (nodes, elements), got {tuple(node_attrs.shape)}")
    index = node_attrs.argmax(dim=-1)
    if node_attrs.shape[0] and not (
        bool((node_attrs.sum(dim=-1) == 1).all())
        and bool((node_attrs.gather(1, index[:, None]) == 1).all())
    ):
        raise ValueError("the fused symmetric contraction needs one-hot node_attrs "
                         "(per-element weights are chosen by element index)")
    return index


def contraction_weights(sc: torch.nn.Module, slots: list[tuple[int, int]]) -> list[torch.Tensor]:
    """mace's weight tensors (elements, params, channels) in descriptor operand order."""
    weights = []
    for j, nu in slots:
        contraction = sc.contractions[j]
        if nu == contraction.correlation:
            weights.append(contraction.weights_max)
        else:
            weights.append(contraction.weights[contraction.correlation - 1 - nu])
    return weights


class SymmetricContractionFused(torch.nn.Module):
    """Drop-in for mace's SymmetricContraction: same `forward(x, y)`, same parameters.

    `contractions` is the original module's ModuleList itself (same Parameter objects, same
    state_dict keys); only the computation changes: the weights are contracted with the
    symmetrised U once per call and every node runs one sparse polynomial, on the compiled op
    (`backend` "cpu-fused") or the pure-PyTorch evaluator ("reference", any device).
    """

    def __init__(self, original: torch.nn.Module, backend: str = CPU_FUSED) -> None:
        super().__init__()
        if backend not in _EVALUATORS:
            raise ValueError(f"no fused contraction for backend {backend!r}; "
                             f"choose one of {tuple(_EVALUATORS)}")
        self.backend = backend
        self.irreps_in = original.irreps_in
        self.irreps_out = original.irreps_out
        self.contractions = original.contractions
        self.descriptors = ContractionDescriptors(original)
        self._original = [original]  # a list keeps it out of the module tree and state_dict

    @property
    def original(self) -> torch.nn.Module:
        """The mace module this one replaced (shares its parameters)."""
        return self._original[0]

    def __reduce__(self) -> tuple:
        """Pickle as the mace module it replaced and fuse again on load (descriptors rebuilt)."""
        return _fused_contraction, (self.original, self.training, self.backend)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        desc = self.descriptors
        if x.dim() != 3 or x.shape[2] != desc.num_ell:
            raise ValueError(f"x must be (nodes, channels, {desc.num_ell}), got {tuple(x.shape)}")
        num_nodes, channels = x.shape[0], x.shape[1]
        weights = contraction_weights(self, desc.weight_slots)
        if torch.compiler.is_compiling():  # no data-dependent shapes or checks in a graph
            elem, num_elems = y.argmax(dim=-1), y.shape[1]
        else:
            present, elem = torch.unique(element_index(y), return_inverse=True)
            num_elems = int(present.numel())
            if num_elems < y.shape[1]:  # contract only the weights of elements in the batch
                weights = [w.index_select(0, present) for w in weights]
        run = _EVALUATORS[self.backend]
        term_weights = run(desc.weights, weights, None, num_elems)
        x_t = x.transpose(1, 2).contiguous()
        out = run(desc.forward, [x_t, term_weights], elem, num_nodes, num_elems)
        pieces, offset = [], 0
        for dim in desc.irrep_dims:
            piece = out[:, offset:offset + dim, :].transpose(1, 2)
            pieces.append(piece.reshape(num_nodes, channels * dim))
            offset += dim
        return torch.cat(pieces, dim=-1)


def _fused_contraction(original: torch.nn.Module, training: bool,
                       backend: str = CPU_FUSED) -> SymmetricContractionFused:
    """Unpickles a SymmetricContractionFused (see its `__reduce__`; pickles made before the
    reference backend carry no `backend`: they were cpu-fused)."""
    module = SymmetricContractionFused(original, backend)
    module.training = training
    return module
