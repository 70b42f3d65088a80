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
import os
import warnings

import torch

from cfmtrain.kernels import isa

BUILD_HINT = ("run `python setup.py build_ext --inplace` in the repository (or reinstall "
              "cfmtrain without CFMTRAIN_NO_EXTENSION)")


def load_ops(name: str) -> None:
    """Load a compiled op library (a torch extension without a Python module init) once, in the
    variant for this CPU (kernels/isa.py), or say how to build it."""
    if isa.loaded(name) is not None:
        return
    variant = isa.choose(name)
    module = isa.module_name(name, variant)
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"{module} is not built: {BUILD_HINT}")
    torch.ops.load_library(spec.origin)
    isa.record(name, variant)


NO_EXTENSION = "CFMTRAIN_NO_EXTENSION"  # =1: an install without the compiled extension


def is_built(name: str) -> bool:
    """Whether op library `name` (its generic build, which setup.py always makes) is built and
    this install uses it: CFMTRAIN_NO_EXTENSION=1 (a GPU node's install) ignores any that lies in
    a shared checkout, built for another host's torch."""
    if os.environ.get(NO_EXTENSION) == "1":
        return False
    return importlib.util.find_spec(name) is not None


class MissingOp:
    """An op of a library that is not built: calling it raises ImportError naming the library."""

    def __init__(self, library: str, op: str) -> None:
        self.library, self.op = library, op

    def __call__(self, *args, **kwargs):
        raise ImportError(f"{self.library} is not built (needed for cfmtrain::{self.op}, a CPU "
                          f"kernel): {BUILD_HINT}")

    def __getattr__(self, name: str) -> MissingOp:  # an overload, e.g. `.default`
        return self


class MissingOps:
    """`torch.ops.cfmtrain`'s stand-in where an op library is not built (an install for GPU
    nodes, CFMTRAIN_NO_EXTENSION=1): its modules import, and each op raises at its first call."""

    def __init__(self, library: str) -> None:
        self.library = library

    def __getattr__(self, op: str) -> MissingOp:
        return MissingOp(self.library, op)


def compiled_ops(name: str):
    """`torch.ops.cfmtrain` with op library `name` loaded (as `load_ops`), or, where it is not
    built, a MissingOps whose ops raise at their first call: a module of CPU kernels imports
    without the compiled extension, and fails loudly only when one of its kernels runs."""
    if not is_built(name):
        return MissingOps(name)
    load_ops(name)
    return torch.ops.cfmtrain


def ops_built(ops) -> bool:
    """False for a MissingOps (registrations of fake kernels and formulas are skipped)."""
    return not isinstance(ops, MissingOps)


CPU_LIBRARIES = ("cfmtrain._ops_symmetric_contraction", "cfmtrain._ops_channelwise_conv",
                 "cfmtrain._ops_radial_mlp", "cfmtrain._ops_dense_mm", "cfmtrain._ops_silu")


def require_cpu_kernels() -> None:
    """Raise ImportError naming the fused CPU kernels' op libraries that are not built."""
    missing = [name for name in CPU_LIBRARIES if not is_built(name)]
    if missing:
        raise ImportError(f"the fused CPU kernels are not built ({', '.join(missing)}): "
                          f"{BUILD_HINT}; on a CUDA device they run through cuEquivariance")


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
