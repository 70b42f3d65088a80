"""Builds the compiled parts under kernels/ into the cfmtrain package.

kernels/balance/*.cpp -> cfmtrain._balance (pybind11, no torch);
kernels/<op>.cpp + kernels/cpu/<op>_cpu*.cpp -> cfmtrain._ops_<op> (torch custom ops, OpenMP),
built for the compiler's default target and, on x86-64, also as cfmtrain._ops_<op>_<variant> per
tuned ISA variant (src/cfmtrain/kernels/isa.py; CFMTRAIN_CPU_ARCH=generic builds none);
kernels/cuda/<op>_cuda*.cu joins the generic one only when torch was built with CUDA and nvcc is
present.

CFMTRAIN_NO_EXTENSION=1 builds none of them (nor imports torch or pybind11): cfmtrain as plain
Python, for a GPU node, where cuEquivariance runs both paper kernels and the Python twins of the
compiled pieces assemble the batches and pack them (docs/gpu.md).
"""

import copy
import os
import platform
import runpy
from glob import glob

from setuptools import setup

# -g0 (after Python's own CFLAGS, which carry -g): the debug info made the conv's objects 7x
# larger and its compile 27% slower (3:38 against 2:40 min on a 2-core host).
RELEASE = ["-O3", "-g0"]
OPT = [*RELEASE, "-fopenmp"]


def compiled_setup() -> None:
    """setup() with every extension (torch and pybind11 imported only here)."""
    import torch
    from pybind11.setup_helpers import Pybind11Extension
    from torch.utils.cpp_extension import (
        CUDA_HOME,
        BuildExtension,
        CppExtension,
        CUDAExtension,
    )

    tuned = runpy.run_path("src/cfmtrain/kernels/isa.py")["build_variants"](platform.machine())
    ext_modules = []
    balance_sources = sorted(glob("kernels/balance/*.cpp"))
    if balance_sources:
        ext_modules.append(
            Pybind11Extension("cfmtrain._balance", balance_sources, cxx_std=17,
                              extra_compile_args=RELEASE)
        )

    class BuildPerExtension(BuildExtension):
        """torch's BuildExtension with each extension's objects in its own directory (the ISA
        variants compile the same sources with different flags), so that the extensions can
        build in parallel: each builds through its own shallow copy of the command, none
        changes shared state."""

        def build_extension(self, ext):
            own = copy.copy(self)
            own.build_temp = os.path.join(self.build_temp, ext.name)
            super(BuildPerExtension, own).build_extension(ext)

    # One torch extension per op and ISA variant (kernels/<op>.cpp + kernels/cpu/<op>_cpu.cpp
    # [+ cuda/<op>_cuda.cu]): each op builds, fails and reloads on its own; ops register with
    # TORCH_LIBRARY_FRAGMENT, so a process loads one variant of each (cfmtrain.kernels.isa).
    use_cuda = torch.version.cuda is not None and CUDA_HOME is not None
    for entry in sorted(glob("kernels/*.cpp")):
        op = entry.removeprefix("kernels/").removesuffix(".cpp")
        sources = [entry] + sorted(glob(f"kernels/cpu/{op}_cpu*.cpp"))
        cuda = sorted(glob(f"kernels/cuda/{op}_cuda*.cu")) if use_cuda else []
        for variant, flags in [("", [])] + [(f"_{v}", f) for v, f in tuned.items()]:
            if cuda:
                ext_modules.append(CUDAExtension(
                    f"cfmtrain._ops_{op}{variant}", sources + cuda, include_dirs=["kernels"],
                    define_macros=[("CFMTRAIN_WITH_CUDA", "1")],
                    extra_compile_args={"cxx": OPT + flags, "nvcc": ["-O3"]},
                    extra_link_args=["-fopenmp"]))
            else:
                ext_modules.append(CppExtension(
                    f"cfmtrain._ops_{op}{variant}", sources, include_dirs=["kernels"],
                    extra_compile_args=OPT + flags, extra_link_args=["-fopenmp"]))

    # The extensions build in parallel, one per core (each compiles its own sources with ninja),
    # the largest sources first, so that the conv's long compile overlaps the short ones.
    ext_modules.sort(key=lambda ext: -sum(os.path.getsize(s) for s in ext.sources))
    setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildPerExtension},
          options={"build_ext": {"parallel": os.cpu_count() or 1}})


if os.environ.get("CFMTRAIN_NO_EXTENSION") == "1":
    setup()  # the package alone, as plain Python: pyproject.toml's metadata
else:
    compiled_setup()
