"""Which implementation of the fused kernels runs on a device, warned about once and recorded.

CPU: our compiled ops ('cpu-fused'). CUDA: cuEquivariance for both of the paper's kernels, the
symmetric contraction and the channelwise conv with its gather and scatter, when cuequivariance
is installed ('cueq', kernels.cueq), else mace-torch's own e3nn code ('mace'). 'reference',
only when asked for, is our fused symmetric contraction on the pure-PyTorch evaluator of
kernels/reference.py (any device): it checks the descriptors independently of the compiled ops
and is not meant to be fast.
"""

from __future__ import annotations

import importlib.util
import warnings

import torch

from cfmtrain.kernels import isa


def load_ops(name: str) -> None:
    """Load a compiled op library (a torch extension without a Python module init) once, in the
    variant for this CPU (kernels/isa.py), or say how to build it."""
    if isa.loaded(name) is not None:
        return
    variant = isa.choose(name)
    module = isa.module_name(name, variant)
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"{module} is not built: run `python setup.py build_ext --inplace` "
                          "in the repository (or reinstall cfmtrain)")
    torch.ops.load_library(spec.origin)
    isa.record(name, variant)


CPU_FUSED = "cpu-fused"
CUEQ = "cueq"
MACE = "mace"
REFERENCE = "reference"
BACKENDS = (CPU_FUSED, CUEQ, REFERENCE, MACE)

_warned: set[tuple[str, ...]] = set()


def cueq_available() -> bool:
    """True when cuequivariance and cuequivariance_torch are importable."""
    return all(importlib.util.find_spec(m) is not None
               for m in ("cuequivariance", "cuequivariance_torch"))


def choose_backend(device: torch.device | str) -> str:
    """The kernels' backend for `device`: "cpu-fused" on CPU, "cueq" on CUDA with cuequivariance
    installed, else "mace" (mace-torch's e3nn code, warned once per device type)."""
    device = torch.device(device)
    if device.type == "cpu":
        return CPU_FUSED
    if device.type == "cuda" and cueq_available():
        return CUEQ  # both kernels through cuEquivariance: nothing to warn about
    backend = MACE
    reason = (f"no fused kernels for {device.type}"
              + (" and cuequivariance is not installed" if device.type == "cuda" else "")
              + ": using mace-torch's own (e3nn) path")
    if (device.type, backend) not in _warned:
        _warned.add((device.type, backend))
        warnings.warn(reason, stacklevel=2)
    return backend


def mace_conv_backend(model: torch.nn.Module) -> str:
    """The backend of a model's unfused convs: "cueq" when mace-torch built them with
    cuEquivariance (a cueq_config), else "mace" (e3nn)."""
    for block in getattr(model, "interactions", ()):
        if type(getattr(block, "conv_tp", None)).__module__.startswith("cuequivariance_torch"):
            return CUEQ
    return MACE


def choose_conv_backend(device: torch.device | str, model: torch.nn.Module) -> str:
    """The conv backend for `model` on a device without fused kernels (or with `conv=False`);
    warns once per (device type, backend): mace-torch's conv as the model has it."""
    device = torch.device(device)
    if device.type == "cpu":
        return CPU_FUSED
    backend = mace_conv_backend(model)
    if backend == CUEQ:
        reason = "using the model's own cuEquivariance conv (mace-torch built it so)"
    else:
        reason = f"no fused conv for {device.type}: using mace-torch's own (e3nn) conv"
    if (device.type, "conv", backend) not in _warned:
        _warned.add((device.type, "conv", backend))
        warnings.warn(reason, stacklevel=2)
    return backend


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's first parameter (CPU for a parameterless model)."""
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def kernel_backend(model: torch.nn.Module) -> dict:
    """Metadata for a run: the backend `fuse_model` chose, per kernel (empty when not fused)."""
    return dict(getattr(model, "cfmtrain_kernel_backend", {}))
