"""mace-torch's cuEquivariance symmetric contraction on a mace model's own parameters.

The backend for CUDA devices until cfmtrain has CUDA kernels: like mace's e3nn->cueq converter,
but the weights stay mace's Parameters (state_dict unchanged) and are mapped on every call.
"""

from __future__ import annotations

import torch
from e3nn import o3

from cfmtrain.kernels.backend import CUEQ
from cfmtrain.kernels.symmetric_contraction import element_index, u_matrix_float64


def _uses_reduced_cg(sc: torch.nn.Module) -> bool:
    """Whether mace built `sc` with the reduced (cuequivariance) CG basis."""
    from mace.tools.cg import U_matrix_real

    contraction, irrep = sc.contractions[0], sc.irreps_out[0].ir
    nu = contraction.correlation
    u = u_matrix_float64(contraction, irrep, nu)
    reduced = U_matrix_real(contraction.coupling_irreps, o3.Irreps(str(irrep)), nu,
                            use_cueq_cg=True, dtype=torch.float64)[-1]
    return reduced.shape == u.shape and torch.allclose(reduced, u, atol=1e-6)


class SymmetricContractionCueq(torch.nn.Module):
    """Drop-in for mace's SymmetricContraction running cuet.SymmetricContraction's polynomial.

    `method` is cuequivariance's: "uniform_1d" (CUDA kernel) or "naive" (PyTorch, any device).
    """

    backend = CUEQ

    def __init__(self, original: torch.nn.Module, method: str = "uniform_1d") -> None:
        super().__init__()
        import cuequivariance as cue
        import cuequivariance_torch as cuet
        from mace.tools.cg import O3_e3nn
        from mace.tools.cg_cueq_tools import symmetric_contraction_proj

        self.irreps_in, self.irreps_out = original.irreps_in, original.irreps_out
        self.contractions = original.contractions
        self.method = method
        self._original = [original]
        self.reduced = _uses_reduced_cg(original)
        first = original.contractions[0].weights_max
        correlation = original.contractions[0].correlation
        module = cuet.SymmetricContraction(
            cue.Irreps(O3_e3nn, str(self.irreps_in)), cue.Irreps(O3_e3nn, str(self.irreps_out)),
            contraction_degree=correlation, num_elements=first.shape[0],
            layout_in=cue.ir_mul, layout_out=cue.mul_ir, original_mace=not self.reduced,
            dtype=first.dtype, math_dtype=first.dtype, method=method, device=first.device)
        self._cueq = [module]  # not a submodule: its own weight must not enter the state_dict
        self._proj = None
        if self.reduced:
            coupling = [o3.Irreps([mul_ir.ir for mul_ir in irreps])
                        for irreps in (self.irreps_in, self.irreps_out)]
            _, proj = symmetric_contraction_proj(cue.Irreps(O3_e3nn, str(coupling[0])),
                                                 cue.Irreps(O3_e3nn, str(coupling[1])),
                                                 list(range(1, correlation + 1)))
            self._proj = torch.tensor(proj)

    @property
    def original(self) -> torch.nn.Module:
        """The mace module this one replaced (shares its parameters)."""
        return self._original[0]

    def __reduce__(self) -> tuple:
        """Pickle as the mace module it replaced and rebuild the cuet module on load."""
        return _cueq_contraction, (self.original, self.method, self.training)

    def _weights(self) -> torch.Tensor:
        """mace's weights in cuet's layout (as mace.cli.convert_e3nn_cueq maps them)."""
        weights = []
        for contraction in self.contractions:
            slots = [(contraction.weights_max, contraction.weights_max_zeroed)]
            slots += [(w, getattr(contraction, f"weights_{i}_zeroed"))
                      for i, w in enumerate(contraction.weights)]
            weights += [w for w, zeroed in slots if self.reduced or not bool(zeroed)]
        weight = torch.cat(weights, dim=1)
        module = self._cueq[0]
        if self._proj is not None:
            weight = torch.einsum("zau,ab->zbu", weight, self._proj.to(weight))
        elif module.projection is not None:
            weight = torch.einsum("zau,ab->zbu", weight, module.projection.to(weight))
        return weight.flatten(1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        module = self._cueq[0]
        if module.weight.device != x.device or module.weight.dtype != x.dtype:
            self._cueq[0] = module = module.to(device=x.device, dtype=x.dtype)
        index = element_index(y).int()
        out = module.f([self._weights(), module.transpose_in(x.transpose(1, 2).flatten(1))],
                       input_indices={0: index})[0]
        return module.transpose_out(out)


def _cueq_contraction(original: torch.nn.Module, method: str,
                      training: bool) -> SymmetricContractionCueq:
    """Unpickles a SymmetricContractionCueq (see its `__reduce__`)."""
    module = SymmetricContractionCueq(original, method=method)
    module.training = training
    return module
