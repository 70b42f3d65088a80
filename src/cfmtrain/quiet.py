"""The libraries' warnings a cfmtrain command does not print, each named precisely.

mace-torch sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 for the whole process when it is imported, so
torch warns once when e3nn loads its own constants file; TorchScript warns of its deprecation and
of its type system while mace-torch and e3nn script their modules. None of these is about the
user's data or settings. `install` ignores exactly these (by message, category and module) in
this process and, through PYTHONWARNINGS, in every process it starts (the supervised child,
torchrun's ranks, the benchmarks' workers); every other warning, cfmtrain's own included, is
printed as usual.
"""

from __future__ import annotations

import builtins
import os
import re
import warnings
from collections.abc import MutableMapping

# (the message's start, its category, the module that warns; "" where the warning names the
# caller's module, which differs from call to call)
LIBRARY_WARNINGS: tuple[tuple[str, str, str], ...] = (
    ("Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected", "UserWarning",
     "e3nn.o3._wigner"),
    ("`torch.jit.script` is deprecated", "DeprecationWarning", "torch.jit._script"),
    ("The TorchScript type system doesn't support instance-level annotations", "UserWarning",
     ""),
)


def options() -> list[str]:
    """The filters as `-W` options (PYTHONWARNINGS' entries)."""
    return [f"ignore:{message}:{category}:{module}"
            for message, category, module in LIBRARY_WARNINGS]


def install(env: MutableMapping[str, str] = os.environ) -> None:
    """Ignore the library warnings in this process and in the processes started with `env`."""
    for message, category, module in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message),
                                category=getattr(builtins, category),
                                module=re.escape(module) + r"\Z" if module else "")
    present = [o for o in env.get("PYTHONWARNINGS", "").split(",") if o]
    env["PYTHONWARNINGS"] = ",".join(present + [o for o in options() if o not in present])
