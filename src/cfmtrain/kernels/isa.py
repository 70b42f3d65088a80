"""Per-ISA builds of the compiled ops, and which one a process loads.

Each op library is built generic (`cfmtrain._ops_<op>`: -O3 for the compiler's default target,
baseline x86-64 or aarch64) and, on x86-64, also tuned (`cfmtrain._ops_<op>_<variant>`, see
VARIANTS). The kernels vectorise through `#pragma omp simd`, so the same sources serve every target.

`CFMTRAIN_CPU_ARCH` (unset: auto): at build time `generic` builds only the generic libraries and a
variant name (`avx2`) builds the generic ones and that variant; at run time `generic`
loads the generic libraries even where a tuned one is built and the CPU could run it, and a variant
name loads that variant (an error if it is not built or the CPU cannot run it). Auto: build every
variant on x86-64; load the most tuned one that is built and that the CPU supports (by its
/proc/cpuinfo flags; no such file: generic). One variant per op and process: the variants register
the same ops.

Only the standard library here: setup.py runs this file (build_variants) before cfmtrain is built.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path

ENV = "CFMTRAIN_CPU_ARCH"
GENERIC = "generic"
# tuned variant -> (extra compiler flags, /proc/cpuinfo flags the CPU needs); the most tuned first.
# avx2 is the x86-64-v3 level (AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE). An x86-64-v4 (AVX-512)
# variant measured no faster than avx2 in CPU time (docs/kernels.md), so none is built.
VARIANTS: dict[str, tuple[list[str], frozenset[str]]] = {
    "avx2": (["-march=x86-64-v3"],
             frozenset("avx avx2 fma bmi1 bmi2 f16c abm movbe xsave".split())),
}
X86_64 = ("x86_64", "amd64")

_loaded: dict[str, str] = {}


def arch_setting(env: dict[str, str] | None = None) -> str:
    """The value of CFMTRAIN_CPU_ARCH: "auto" (unset or empty), "generic" or a variant name."""
    value = (os.environ if env is None else env).get(ENV, "") or "auto"
    if value not in ("auto", GENERIC, *VARIANTS):
        raise ValueError(f"{ENV}={value!r}: expected one of generic, {', '.join(VARIANTS)} "
                         "or unset (auto)")
    return value


def build_variants(machine: str, env: dict[str, str] | None = None) -> dict[str, list[str]]:
    """The tuned variants setup.py builds on `machine` (platform.machine()), with their extra
    compiler flags; the generic libraries are always built, with no target flags."""
    setting = arch_setting(env)
    if setting == GENERIC:
        return {}
    if machine.lower() not in X86_64:
        if setting != "auto":
            raise ValueError(f"{ENV}={setting}: an x86-64 variant, but this machine is {machine}")
        return {}
    return {name: flags for name, (flags, _) in VARIANTS.items() if setting in ("auto", name)}


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags from the first `flags` line of `cpuinfo` (empty if there is none)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def supported_variants(flags: frozenset[str]) -> list[str]:
    """The tuned variants a CPU with `flags` can run, the most tuned first."""
    return [name for name, (_, needs) in VARIANTS.items() if needs <= flags]


def module_name(name: str, variant: str) -> str:
    """The extension module of op library `name` (e.g. "cfmtrain._ops_conv") in `variant`."""
    return name if variant == GENERIC else f"{name}_{variant}"


def choose(name: str, flags: frozenset[str] | None = None,
           env: dict[str, str] | None = None) -> str:
    """The variant of op library `name` to load: the one CFMTRAIN_CPU_ARCH names, else the most
    tuned one that is built and that the CPU (`flags`, default /proc/cpuinfo's) supports (a
    warning when the CPU supports one that is not built)."""
    setting = arch_setting(env)
    if setting == GENERIC:
        return GENERIC
    flags = cpu_flags() if flags is None else flags
    if setting != "auto":
        missing = VARIANTS[setting][1] - flags
        if missing:
            raise RuntimeError(f"{ENV}={setting}: this CPU lacks {' '.join(sorted(missing))}")
        return setting
    supported = supported_variants(flags)
    for variant in supported:
        if importlib.util.find_spec(module_name(name, variant)) is not None:
            return variant
    if supported:
        warnings.warn(f"{module_name(name, supported[0])} is not built: using the generic "
                      f"{name}, which is slower on this CPU; rebuild with `python setup.py "
                      f"build_ext --inplace`, or set {ENV}=generic to choose it", stacklevel=3)
    return GENERIC


def record(name: str, variant: str) -> None:
    """Note that op library `name` was loaded in `variant`."""
    _loaded[name] = variant


def loaded(name: str) -> str | None:
    """The variant op library `name` was loaded in, None if it was not loaded."""
    return _loaded.get(name)


def cpu_variant() -> str:
    """The variant of the op libraries this process loaded, for a run's provenance ("generic",
    "avx2", ...; "none" before any was loaded; variants joined by "+" if they differ)."""
    return "+".join(sorted(set(_loaded.values()))) or "none"
