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


def without_codegen(model: torch.nn.Module) -> torch.nn.Module:
    """The same (unfused) mace-torch model, config and weights, rebuilt without e3nn's
    TorchScript code, which dynamo cannot trace: for a model loaded from a file, which keeps the
    code it was saved with."""
    from mace.tools.compile import disable_e3nn_codegen
    from mace.tools.scripts_utils import extract_config_mace_model

    config = extract_config_mace_model(model)
    if "error" in config:
        raise ValueError(f"without_codegen: cannot read the model's config: {config['error']}")
    dtype, previous = next(model.parameters()).dtype, torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # constants (CG tensors) made in the model's precision
    try:
        with disable_e3nn_codegen():
            rebuilt = type(model)(**config)
    finally:
        torch.set_default_dtype(previous)
    rebuilt.load_state_dict(model.state_dict())
    return rebuilt.to(dtype)


def prepare_for_compile(model: torch.nn.Module) -> torch.nn.Module:
    """Ready a (fused or plain) mace-torch model for `torch.compile`, in place, and return it.

    The model must hold no TorchScript code: build it under
    `mace.tools.compile.disable_e3nn_codegen()`, or rebuild a loaded one with `without_codegen`
    before fusing. Give the batch's positions `requires_grad` before calling the compiled model
    (a compiled graph cannot turn it on for an input)."""
    from mace.tools.compile import configure_autograd_for_compile, simplify

    scripted = [name for name, m in model.named_modules()
                if isinstance(m, torch.jit.ScriptModule)]
    if scripted:
        raise ValueError(f"prepare_for_compile: {len(scripted)} TorchScript submodules (first: "
                         f"{scripted[0]!r}); build the model under "
                         "mace.tools.compile.disable_e3nn_codegen(), or rebuild a loaded one "
                         "with cfmtrain.kernels.without_codegen")
    configure_autograd_for_compile(True)
    return simplify(model)
