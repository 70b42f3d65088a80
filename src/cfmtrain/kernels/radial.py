"""MACE's radial MLP (e3nn's FullyConnectedNet on every edge) with its normalisation constants
folded into the weights.

e3nn scales each layer's weight by 1/sqrt(fan-in), then multiplies the activation's output by the
constant that normalises its second moment and by sqrt(var_out) (1 inside the net): two passes
over an [edges, hidden] tensor per hidden layer, in the forward pass and again in both backward
passes a force-trained model takes. Folded, those constants scale the next layer's (small)
weight instead, so each hidden layer is one matmul and one activation. The function is the same
up to rounding. Unless the net is being trained (inference, MD) the SiLU hidden layers run as one
compiled op over chunks of edges (kernels/radial_mlp.cpp), their activations kept in the cache.
Each bond's two edges share their radial features, so the net runs on one edge per pair
(kernels.edge_pairs): its interaction block hands it the edges by a forward pre-hook.
"""

from __future__ import annotations

import weakref

import torch
from e3nn.math import normalize2mom
from e3nn.nn import FullyConnectedNet

from cfmtrain.kernels.adopt import Adopting, swap_in, swap_out
from cfmtrain.kernels.backend import compiled_ops, ops_built
from cfmtrain.kernels.dense import dense_matmul
from cfmtrain.kernels.edge_pairs import EdgePairs, edge_pairs
from cfmtrain.kernels.silu import silu

_OPS = compiled_ops("cfmtrain._ops_radial_mlp")  # ops raise at first call if not built


def _hidden(x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    """silu(... silu(x @ W0) ... @ Wn) in torch's ops."""
    for w in weights:
        x = torch.nn.functional.silu(x @ w)
    return x


def _radial_mlp_fake(x, weights, save_z):
    return (x.new_empty((x.shape[0], weights[-1].shape[1])),
            [x.new_empty((x.shape[0], w.shape[1])) for w in weights] if save_z else [])


def _radial_mlp_backward_fake(x, weights, z, grad, need_x, need_weights):
    return (x.new_empty(x.shape if need_x else (0,)),
            [w.new_empty(w.shape) for w in weights] if need_weights else [])


if ops_built(_OPS):
    torch.library.register_fake("cfmtrain::radial_mlp")(_radial_mlp_fake)
    torch.library.register_fake("cfmtrain::radial_mlp_backward")(_radial_mlp_backward_fake)


class _FusedHidden(torch.autograd.Function):
    """SiLU hidden layers by the compiled op (which keeps each layer's pre-activations for the
    backward): first derivatives compiled too, a backward that builds a graph (e.g. a Hessian)
    through torch's ops."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        save = any(ctx.needs_input_grad)
        out, z = _OPS.radial_mlp(x, list(weights), save)
        ctx.save_for_backward(x, *weights, *z)
        ctx.layers = len(weights)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:
        x, *rest = ctx.saved_tensors
        weights, z = rest[:ctx.layers], rest[ctx.layers:]
        need_x, *need_w = ctx.needs_input_grad
        if torch.is_grad_enabled():
            inputs = [t for t, n in zip((x, *weights), (need_x, *need_w), strict=True) if n]
            got = iter(torch.autograd.grad(_hidden(x, weights), inputs, grad, create_graph=True))
            return tuple(next(got) if n else None for n in (need_x, *need_w))
        gx, gw = _OPS.radial_mlp_backward(x, weights, z, grad.contiguous(), need_x, any(need_w))
        return (gx if need_x else None,
                *(g if n else None for g, n in zip(gw or [None] * len(weights), need_w,
                                                   strict=True)))


def _plan(fc: FullyConnectedNet) -> tuple[list[tuple[float, object]], float]:
    """Per layer (weight scale, activation function or None), and the factor left at the end
    (an activated last layer's constant)."""
    plan, carry = [], 1.0
    for layer in fc.children():
        act = layer.act
        if act is None:
            plan.append((carry / (layer.h_in * layer.var_in / layer.var_out) ** 0.5, None))
            carry = 1.0
        elif isinstance(act, normalize2mom):
            f = silu if act.f is torch.nn.functional.silu else act.f  # fused 2nd derivative
            plan.append((carry / (layer.h_in * layer.var_in) ** 0.5, f))
            carry = (1.0 if act._is_id else act.cst) * layer.var_out ** 0.5
        else:
            raise TypeError(f"fold_radial_mlps: unsupported activation {act!r} in {fc}")
    return plan, carry


class FoldedRadialMLP(Adopting):
    """An e3nn FullyConnectedNet computed with its constants folded into the weights. It adopts
    the net's layers under the same names (state_dict unchanged); `restore()` gives it back.

    `factored` (set by the fused conv that consumes it, kernels.conv): the forward stops before
    the last linear layer and returns the last hidden activations [edges, hidden]; the conv
    multiplies them by `basis()` per chunk of edges, so the [edges, weights] output is never
    stored.
    """

    def __init__(self, fc: FullyConnectedNet, factored: bool = False) -> None:
        plan, carry = _plan(fc)
        super().__init__(fc)
        self.plan, self.carry = plan, carry
        self.hs = list(fc.hs)
        self.factored = False
        if factored:
            self.factor()

    @property
    def can_factor(self) -> bool:
        """A linear last layer (no activation, no constant after it) can be factored out."""
        return len(self.plan) > 1 and self.plan[-1][1] is None and self.carry == 1.0

    def factor(self) -> None:
        """From now on return the last hidden layer; the weights are that @ basis()."""
        if not self.can_factor:
            raise ValueError("FoldedRadialMLP: the last layer is not linear; cannot factor it")
        self.factored = True

    def basis(self) -> torch.Tensor:
        """The last layer's [hidden, weights] matrix, constants folded in."""
        layer = list(self.children())[-1]
        return layer.weight * self.plan[-1][0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pairs = self._pairs(x)
        if pairs is None:
            return self._net(x)
        return self._net(x.index_select(0, pairs.rep)).index_select(0, pairs.inverse)

    def _pairs(self, x: torch.Tensor) -> EdgePairs | None:
        """The pairs of the edges its block handed over (`_stash_edges`), if `x` is their radial
        features."""
        stashed, self.__dict__["_edges"] = self.__dict__.get("_edges"), None
        if stashed is None or torch.compiler.is_compiling():
            return None
        edge_index, edge_attrs, edge_feats, irreps = stashed
        if edge_feats is not x or any(t is None for t in (edge_index, edge_attrs, irreps)):
            return None
        edges = (edge_index, edge_attrs, x)
        for refs, version, pairs in _pairs_cache:
            if (all(r() is t for r, t in zip(refs, edges, strict=True))
                    and version == edge_index._version):
                return pairs
        pairs = edge_pairs(edge_index, edge_attrs, x.detach(), irreps)
        _pairs_cache[:] = [(tuple(weakref.ref(t) for t in edges), edge_index._version, pairs)]
        return pairs

    def _net(self, x: torch.Tensor) -> torch.Tensor:
        layers = list(zip(self.children(), self.plan, strict=True))
        if self.factored:
            layers = layers[:-1]
        # Leading SiLU layers by the compiled op, unless the net is being trained (a force loss
        # then differentiates it twice: torch's ops and the fused SiLU second derivative).
        training = self.training and any(p.requires_grad for p in self.parameters())
        fused = 0
        if (not training and x.device.type == "cpu" and not torch.compiler.is_compiling()
                and x.dtype in (torch.float32, torch.float64)):
            while fused < len(layers) and layers[fused][1][1] is silu:
                fused += 1
        if fused:
            x = _FusedHidden.apply(x.contiguous(), *(layer.weight * scale
                                                     for layer, (scale, _) in layers[:fused]))
        for layer, (scale, act) in layers[fused:]:
            x = dense_matmul(x, layer.weight * scale)
            if act is not None:
                x = act(x)
        return x if self.carry == 1.0 or self.factored else x * self.carry

    def __reduce__(self) -> tuple:
        """Pickle as the e3nn net and fold it again on load."""
        return _folded, (Adopting.restore(self), self.training, self.factored)

    def restore(self) -> FullyConnectedNet:
        """The original FullyConnectedNet, holding this module's current layers (this module
        returns whole weights again)."""
        self.factored = False
        return super().restore()


# The last pairing: (weak references to edge_index, edge_attrs, edge_feats), version, pairs. The
# blocks of one forward share their edges, so each forward pairs them once.
_pairs_cache: list = []


def _stash_edges(block: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook of an interaction block: hands its edges (mace-torch passes them by
    keyword; positions follow InteractionBlock.forward) to its FoldedRadialMLP."""
    mlp = getattr(block, "conv_tp_weights", None)
    if not isinstance(mlp, FoldedRadialMLP) or torch.compiler.is_compiling():
        return
    def get(name: str, position: int) -> torch.Tensor | None:
        return kwargs.get(name, args[position] if len(args) > position else None)

    mlp.__dict__["_edges"] = (get("edge_index", 4), get("edge_attrs", 2), get("edge_feats", 3),
                              getattr(block, "edge_attrs_irreps", None))


def _hooked(block: torch.nn.Module) -> list[int]:
    """The keys of `_stash_edges` among the block's forward pre-hooks."""
    return [key for key, hook in block._forward_pre_hooks.items() if hook is _stash_edges]


def _folded(fc: FullyConnectedNet, training: bool, factored: bool = False) -> FoldedRadialMLP:
    """Unpickles a FoldedRadialMLP (see its `__reduce__`)."""
    mlp = FoldedRadialMLP(fc, factored)
    mlp.training = training
    return mlp


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "conv_tp_weights")]


def fold_radial_mlps(model: torch.nn.Module) -> int:
    """Swap FoldedRadialMLP into every interaction block whose radial MLP is e3nn's
    FullyConnectedNet (other radial networks are left as they are), in place; returns how many
    are folded."""
    blocks = _blocks(model)
    folded = swap_in(blocks, "conv_tp_weights", FoldedRadialMLP,
                     lambda mlp: type(mlp) is FullyConnectedNet)
    for block in blocks:
        if isinstance(block.conv_tp_weights, FoldedRadialMLP) and not _hooked(block):
            block.register_forward_pre_hook(_stash_edges, with_kwargs=True)
    return folded


def unfold_radial_mlps(model: torch.nn.Module) -> torch.nn.Module:
    """Put the original FullyConnectedNets back (the inverse of `fold_radial_mlps`), in place."""
    blocks = _blocks(model)
    swap_out(blocks, "conv_tp_weights", FoldedRadialMLP)
    for block in blocks:  # the hook goes too: a plain model must not need cfmtrain to load
        for key in _hooked(block):
            del block._forward_pre_hooks[key]
            block._forward_pre_hooks_with_kwargs.pop(key, None)
    return model
