"""The paper's two kernels through cuEquivariance, on a mace model's own parameters: the
symmetric contraction and the channelwise convolution tensor product with its gather from
senders and scatter-sum to receivers.

The backend for CUDA devices (cuEquivariance's CUDA kernels; its PyTorch fallback elsewhere):
like mace's e3nn->cueq converter, but the weights stay mace's Parameters (state_dict unchanged),
mapped on every call, so an unfused model is an ordinary mace-torch model.
"""

from __future__ import annotations

import torch
from e3nn import o3

from cfmtrain.kernels.adopt import Adopting
from cfmtrain.kernels.backend import CUEQ
from cfmtrain.kernels.symmetric_contraction import element_index, u_matrix_float64


def _uses_reduced_cg(sc: torch.nn.Module) -> bool:
    """Whether mace built `sc` with the reduced (cuequivariance) CG basis: every output irrep's
    U tensor is the reduced one (one alone can be the same in both bases: the scalar output's of
    a correlation-2 contraction, whose vector output has 4 paths in the original basis and 2 in
    the reduced one)."""
    from mace.tools.cg import U_matrix_real

    for contraction, mul_ir in zip(sc.contractions, sc.irreps_out, strict=True):
        nu = contraction.correlation
        u = u_matrix_float64(contraction, mul_ir.ir, nu)
        reduced = U_matrix_real(contraction.coupling_irreps, o3.Irreps(str(mul_ir.ir)), nu,
                                use_cueq_cg=True, dtype=torch.float64)[-1]
        if reduced.shape != u.shape or not torch.allclose(reduced, u, atol=1e-6):
            return False
    return True


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


def cueq_method(device: torch.device) -> str:
    """cuEquivariance's method for `device`: its CUDA kernels ("uniform_1d") on CUDA, else its
    PyTorch fallback ("naive")."""
    return "uniform_1d" if device.type == "cuda" else "naive"


CONV_FUSION_TAG = "cfmtrain-cueq"  # a block's `conv_fusion`: its conv_tp takes edge_index


class ChannelwiseConvCueq(Adopting):
    """Drop-in `conv_tp` for a block with `conv_fusion`: (x, Y, W, edge_index) -> node messages,
    by cuet.ChannelWiseTensorProduct gathering x from the senders and summing the messages
    into the receivers in one call. It adopts the e3nn TensorProduct's parameters, buffers and
    submodules under their names (state_dict unchanged); `restore()` gives it back."""

    backend = CUEQ

    def __init__(self, tp: torch.nn.Module) -> None:
        super().__init__(tp)
        self.irreps_in1, self.irreps_in2 = tp.irreps_in1, tp.irreps_in2
        self.irreps_out, self.weight_numel = tp.irreps_out, tp.weight_numel
        # ((device, dtype), cuet module) built for the inputs' (not a submodule: its own
        # buffers must not enter the state_dict)
        self.__dict__["_cueq"] = None

    def _module(self, like: torch.Tensor) -> torch.nn.Module:
        """The cuet module for `like`'s device and dtype, built on first use of each."""
        import cuequivariance as cue
        import cuequivariance_torch as cuet
        from mace.tools.cg import O3_e3nn

        key = (like.device, like.dtype)
        if self._cueq is None or self._cueq[0] != key:
            module = cuet.ChannelWiseTensorProduct(
                cue.Irreps(O3_e3nn, str(self.irreps_in1)),
                cue.Irreps(O3_e3nn, str(self.irreps_in2)),
                cue.Irreps(O3_e3nn, str(self.irreps_out)), layout=cue.mul_ir,
                shared_weights=False, internal_weights=False, device=like.device,
                dtype=like.dtype, math_dtype=like.dtype, method=cueq_method(like.device))
            if str(module.irreps_out) != str(self.irreps_out) or \
                    module.weight_numel != self.weight_numel:
                raise TypeError(f"cuEquivariance's channelwise product of {self.irreps_in1} and "
                                f"{self.irreps_in2} gives {module.irreps_out} with "
                                f"{module.weight_numel} weights; the block's e3nn product gives "
                                f"{self.irreps_out} with {self.weight_numel}")
            self.__dict__["_cueq"] = (key, module)
        return self._cueq[1]

    def forward(self, node_feats: torch.Tensor, edge_attrs: torch.Tensor,
                tp_weights: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self._module(node_feats)(node_feats, edge_attrs, tp_weights,
                                        indices_1=edge_index[0], indices_out=edge_index[1],
                                        size_out=node_feats.shape[0])


def _interaction_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    from mace.modules.blocks import InteractionBlock

    return [m for m in model.modules() if isinstance(m, InteractionBlock) and hasattr(m, "conv_tp")]


def fuse_cueq_convs(model: torch.nn.Module) -> int:
    """Put ChannelwiseConvCueq in every interaction block whose conv is mace-torch's e3nn
    product (blocks mace built with cuEquivariance keep theirs); returns how many blocks now run
    their conv through cuEquivariance."""
    count = 0
    for block in _interaction_blocks(model):
        conv = block.conv_tp
        if isinstance(conv, o3.TensorProduct) and not hasattr(block, "conv_fusion"):
            block.conv_tp, block.conv_fusion = ChannelwiseConvCueq(conv), CONV_FUSION_TAG
        elif not (isinstance(conv, ChannelwiseConvCueq)
                  or type(conv).__module__.startswith("cuequivariance_torch")):
            raise TypeError(f"fuse_cueq_convs: {type(block).__name__}.conv_tp is "
                            f"{type(conv).__name__}: unfuse it first")
        count += 1
    return count


def unfuse_cueq_convs(model: torch.nn.Module) -> torch.nn.Module:
    """Put the e3nn TensorProducts back (the inverse of `fuse_cueq_convs`), in place."""
    for block in _interaction_blocks(model):
        if isinstance(block.conv_tp, ChannelwiseConvCueq):
            block.conv_tp = block.conv_tp.restore()
            if getattr(block, "conv_fusion", None) == CONV_FUSION_TAG:
                del block.conv_fusion
    return model
