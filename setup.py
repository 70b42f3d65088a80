"""Builds the compiled parts under kernels/ into the cfmtrain package.

kernels/balance/*.cpp -> cfmtrain._balance (pybind11, no torch);
kernels/<op>.cpp + kernels/cpu/<op>_cpu*.cpp -> cfmtrain._ops_<op> (torch custom ops, OpenMP);
kernels/cuda/<op>_cuda*.cu joins it only when torch was built with CUDA and nvcc is present.
"""

from glob import glob

import torch
from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

OPT = ["-O3", "-march=x86-64-v3", "-fopenmp"]

ext_modules = []
balance_sources = sorted(glob("kernels/balance/*.cpp"))
if balance_sources:
    ext_modules.append(
        Pybind11Extension("cfmtrain._balance", balance_sources, cxx_std=17,
                          extra_compile_args=["-O3"])
    )

# One torch extension per op (kernels/<op>.cpp + kernels/cpu/<op>_cpu.cpp [+ cuda/<op>_cuda.cu]):
# each op builds, fails and reloads on its own; ops register with TORCH_LIBRARY_FRAGMENT.
use_cuda = torch.version.cuda is not None and CUDA_HOME is not None
for entry in sorted(glob("kernels/*.cpp")):
    op = entry.removeprefix("kernels/").removesuffix(".cpp")
    sources = [entry] + sorted(glob(f"kernels/cpu/{op}_cpu*.cpp"))
    cuda = sorted(glob(f"kernels/cuda/{op}_cuda*.cu")) if use_cuda else []
    if cuda:
        ext_modules.append(CUDAExtension(
            f"cfmtrain._ops_{op}", sources + cuda, include_dirs=["kernels"],
            define_macros=[("CFMTRAIN_WITH_CUDA", "1")],
            extra_compile_args={"cxx": OPT, "nvcc": ["-O3"]}, extra_link_args=["-fopenmp"]))
    else:
        ext_modules.append(CppExtension(
            f"cfmtrain._ops_{op}", sources, include_dirs=["kernels"],
            extra_compile_args=OPT, extra_link_args=["-fopenmp"]))

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExtension})
