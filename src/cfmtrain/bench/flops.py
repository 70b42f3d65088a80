"""FLOPs a step executes, for the GFLOP/s column of `cfmtrain bench kernels` (compared with a
matmul peak measured in the same run).

Counted by torch's FLOP formulas (`torch.utils.flop_counter`: matmul-like aten ops) and the
fused ops' own, registered beside them (`cfmtrain.kernels.conv`, `...sparse_polynomial`): the
multiplies and adds their kernels execute, in every pass (forward, backward, double backward),
including the weight rows the conv forms from the radial MLP's last layer. Element-wise aten
ops (activations, scaling) are not counted, so for a whole model the count is a lower bound.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


class FlopCount(TorchDispatchMode):
    """Sums the registered FLOP formulas of the ops dispatched inside it, per op.

    (torch's FlopCounterMode also tracks modules with backward hooks, which mace-torch's force
    `autograd.grad` refuses; the counts are the same formulas.)"""

    def __init__(self) -> None:
        super().__init__()
        self.per_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.per_op[str(func._overloadpacket)] += int(formula(*args, **kwargs, out_val=out))
        return out

    @property
    def total(self) -> int:
        return sum(self.per_op.values())


def count_flops(call: Callable[[], object]) -> int:
    """FLOPs executed by one `call()` (see the module docstring)."""
    with FlopCount() as counter:
        call()
    return counter.total
