"""torch.compile of a fused model's whole step, forces and force training included.

mace-torch's own recipe (mace.tools.compile): e3nn modules without TorchScript code generation,
the modules mace registers symbolically traced, and `torch.autograd.grad` traced into the graph,
so that the forces are part of the compiled forward and a force loss's backward is a first-order
backward of that graph (AOT autograd has no double backward). The fused ops take part through
their registered fake kernels and autograd formulas; the few eager-only paths of the fused
modules switch to traceable ones while compiling (`torch.compiler.is_compiling()`).
"""

from __future__ import annotations

import torch


def prepare_for_compile(model: torch.nn.Module) -> torch.nn.Module:
    """Ready a (fused or plain) mace-torch model for `torch.compile`, in place, and return it.

    Build or load the model under `mace.tools.compile.disable_e3nn_codegen()`: TorchScript
    submodules cannot be traced. Give the batch's positions `requires_grad` before calling the
    compiled model (a compiled graph cannot turn it on for an input)."""
    from mace.tools.compile import configure_autograd_for_compile, simplify

    scripted = [name for name, m in model.named_modules()
                if isinstance(m, torch.jit.ScriptModule)]
    if scripted:
        raise ValueError(f"prepare_for_compile: {len(scripted)} TorchScript submodules (first: "
                         f"{scripted[0]!r}); build or load the model under "
                         "mace.tools.compile.disable_e3nn_codegen()")
    configure_autograd_for_compile(True)
    return simplify(model)
