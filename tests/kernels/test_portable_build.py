"""Portable builds (cfmtrain.kernels.isa): setup.py gives the generic op libraries no target flags,
the generic libraries hold no AVX code, and a process loads the one variant CFMTRAIN_CPU_ARCH and
the CPU call for. CI runs this file with CFMTRAIN_CPU_ARCH=generic, so there it proves that the
kernel tests next to it ran the generic libraries."""

import importlib.util
import json
import os
import platform
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import setuptools
import torch
from helpers import REPO

import cfmtrain.kernels.conv  # noqa: F401  (loads the conv's op library, and the dense products')
import cfmtrain.kernels.radial  # noqa: F401  (loads the radial MLP's op library)
import cfmtrain.kernels.silu  # noqa: F401  (loads the radial MLP's activation library)
import cfmtrain.kernels.sparse_polynomial  # noqa: F401  (loads the contraction's op library)
from cfmtrain.kernels import isa
from cfmtrain.kernels.backend import load_ops

pytestmark = pytest.mark.slow  # a fresh interpreter per library variant

# the ops this test file loads
OPS = ("channelwise_conv", "dense_mm", "radial_mlp", "silu", "symmetric_contraction")
LIBRARIES = tuple(f"cfmtrain._ops_{op}" for op in OPS)
ALL_LIBRARIES = tuple(sorted(f"cfmtrain._ops_{p.stem}" for p in (REPO / "kernels").glob("*.cpp")))
X86_64 = platform.machine().lower() in ("x86_64", "amd64")
# the libraries with the runtime-dispatched AVX-512 product (kernels/common/gemm.h)
GEMM_LIBRARIES = tuple(f"cfmtrain._ops_{op}"
                       for op in ("channelwise_conv", "dense_mm", "radial_mlp"))


def setup_extensions(monkeypatch, machine: str, arch: str | None,
                     captured: dict | None = None) -> dict[str, list[str]]:
    """The op extensions setup.py declares on `machine` with CFMTRAIN_CPU_ARCH=`arch`, by module
    name, with their C++ compiler flags (setup() itself is not run; its keyword arguments go to
    `captured` when given)."""
    captured = {} if captured is None else captured
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    monkeypatch.setattr(platform, "machine", lambda: machine)
    if arch is None:
        monkeypatch.delenv(isa.ENV, raising=False)
    else:
        monkeypatch.setenv(isa.ENV, arch)
    runpy.run_path(str(REPO / "setup.py"))
    flags = {}
    for ext in captured["ext_modules"]:
        args = ext.extra_compile_args
        flags[ext.name] = args["cxx"] if isinstance(args, dict) else args
    return {name: args for name, args in flags.items() if name.startswith("cfmtrain._ops_")}


def target_flags(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith("-m")]


def test_setup_generic_build_has_no_target_flags(monkeypatch):
    for machine in ("x86_64", "aarch64"):
        exts = setup_extensions(monkeypatch, machine, "generic")
        assert sorted(exts) == list(ALL_LIBRARIES), machine
        assert all(target_flags(args) == [] for args in exts.values()), exts


def test_setup_auto_builds_every_variant_on_x86_64_only(monkeypatch):
    exts = setup_extensions(monkeypatch, "x86_64", None)
    expected = {lib: [] for lib in ALL_LIBRARIES}
    expected.update({f"{lib}_avx2": ["-march=x86-64-v3"] for lib in ALL_LIBRARIES})
    assert {name: target_flags(args) for name, args in exts.items()} == expected
    exts = setup_extensions(monkeypatch, "aarch64", None)
    assert {name: target_flags(args) for name, args in exts.items()} == {
        lib: [] for lib in ALL_LIBRARIES}
    exts = setup_extensions(monkeypatch, "x86_64", "avx2")
    assert sorted(exts) == sorted([*ALL_LIBRARIES, *(f"{lib}_avx2" for lib in ALL_LIBRARIES)])


def test_setup_builds_in_parallel_largest_first_without_debug_info(monkeypatch):
    """One extension per core at a time, the largest sources first (the conv's long compile
    overlaps the short ones), every library with -g0 (no debug info)."""
    captured = {}
    exts = setup_extensions(monkeypatch, "x86_64", None, captured)
    assert captured["options"]["build_ext"]["parallel"] == (os.cpu_count() or 1)
    assert all("-g0" in args for args in exts.values())
    balance = next(e for e in captured["ext_modules"] if e.name == "cfmtrain._balance")
    assert "-g0" in balance.extra_compile_args
    sizes = [sum(os.path.getsize(REPO / src) for src in e.sources) for e in captured["ext_modules"]]
    assert sizes == sorted(sizes, reverse=True)
    assert captured["ext_modules"][0].name.startswith("cfmtrain._ops_channelwise_conv")


def test_setup_names_a_bad_switch(monkeypatch):
    with pytest.raises(ValueError, match=r"CFMTRAIN_CPU_ARCH='native': expected one of generic"):
        setup_extensions(monkeypatch, "x86_64", "native")
    with pytest.raises(ValueError, match=r"CFMTRAIN_CPU_ARCH=avx2: .* this machine is aarch64"):
        setup_extensions(monkeypatch, "aarch64", "avx2")


# The AVX-512 product of kernels/common/gemm.h: compiled for AVX-512 by a function attribute in
# every library, and called only where the CPU has it (cfmtrain.kernels.dense.gemm_backend).
RUNTIME_DISPATCHED = "cfmtrain::gemm::"


def vector_registers(library: str, skip_dispatched: bool = True) -> set[str]:
    """The x86 vector register kinds (xmm, ymm, zmm) a built library's code uses, outside the
    runtime-dispatched functions unless `skip_dispatched` is off."""
    origin = importlib.util.find_spec(library).origin
    code = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", origin], check=True,
                          capture_output=True, text=True).stdout
    kinds, skip = set(), False
    for line in code.splitlines():
        if line.endswith(">:"):  # a function's first line
            skip = skip_dispatched and RUNTIME_DISPATCHED in line
        elif not skip:
            kinds.update(re.findall(r"%([xyz]mm)\d", line))
    return kinds


def built_variants(library: str) -> list[str]:
    return [v for v in isa.VARIANTS if importlib.util.find_spec(f"{library}_{v}") is not None]


def test_generic_libraries_hold_no_avx_code():
    """The generic libraries run on any x86-64 (SSE2 only: no ymm or zmm registers); a tuned one
    that is built does use the wider registers, so the check can tell them apart."""
    assert set(LIBRARIES) <= set(ALL_LIBRARIES)
    for library in ALL_LIBRARIES:
        if X86_64:
            assert vector_registers(library) <= {"xmm"}, library
            if library in GEMM_LIBRARIES:  # the one place of wider registers
                assert "zmm" in vector_registers(library, skip_dispatched=False), library
            if "avx2" in built_variants(library):
                assert "ymm" in vector_registers(f"{library}_avx2"), library
        else:
            assert built_variants(library) == [], library


def expected_variant(library: str) -> str:
    """The variant a process should load, worked out from the switch, /proc/cpuinfo and the
    files present, apart from isa.choose."""
    setting = os.environ.get(isa.ENV) or "auto"
    if setting != "auto":
        return setting
    flags = set()
    if Path("/proc/cpuinfo").exists():
        flags = set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(),
                              re.MULTILINE).group(1).split())
    has_v3 = {"avx2", "fma", "bmi2", "movbe"} <= flags
    if has_v3 and "avx2" in built_variants(library):
        return "avx2"
    return "generic"


def loaded_files() -> dict[str, list[str]]:
    """File names of the cfmtrain op libraries loaded in this process, per op."""
    names = [Path(p).name for p in torch.ops.loaded_libraries]
    return {op: sorted(n for n in names if n.startswith(f"_ops_{op}")) for op in OPS}


def file_stem(library: str, variant: str) -> str:
    return isa.module_name(library, variant).removeprefix("cfmtrain.") + "."


def test_this_process_loaded_the_expected_variant_once():
    """One library per op, in the variant the switch and CPU call for, and recorded as such."""
    for op, library in zip(OPS, LIBRARIES, strict=True):
        files = loaded_files()[op]
        want = expected_variant(library)
        assert len(files) == 1 and files[0].startswith(file_stem(library, want)), (files, want)
        assert isa.loaded(library) == want
    assert isa.cpu_variant() == "+".join(sorted({expected_variant(lib) for lib in LIBRARIES}))


def loaded_in_child(arch: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != isa.ENV}
    if arch is not None:
        env[isa.ENV] = arch
    script = ("import json, torch, cfmtrain.kernels.conv, cfmtrain.kernels.sparse_polynomial\n"
              "from cfmtrain.kernels import isa\n"
              "print(json.dumps({'variant': isa.cpu_variant(), 'files': sorted("
              "p.rsplit('/', 1)[-1] for p in torch.ops.loaded_libraries)}))")
    out = subprocess.run([sys.executable, "-c", script], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def test_the_switch_forces_the_generic_libraries_at_run_time():
    child = loaded_in_child("generic")
    assert child["variant"] == "generic"
    assert [f.split(".")[0] for f in child["files"]] == [f"_ops_{op}" for op in OPS]


def test_without_the_switch_the_most_tuned_built_variant_loads(monkeypatch):
    monkeypatch.delenv(isa.ENV, raising=False)
    want = {expected_variant(lib) for lib in LIBRARIES}
    child = loaded_in_child(None)
    assert child["variant"] == "+".join(sorted(want))
    assert [f.split(".")[0] for f in child["files"]] == [
        file_stem(lib, expected_variant(lib))[:-1] for lib in LIBRARIES]


def test_choose_by_cpu_flags_and_switch():
    v3 = frozenset("avx avx2 fma bmi1 bmi2 f16c abm movbe xsave".split())
    assert isa.supported_variants(frozenset({"sse2", "avx"})) == []
    assert isa.supported_variants(v3 | {"avx512f"}) == ["avx2"]
    library = LIBRARIES[0]
    assert isa.choose(library, frozenset({"sse2"}), env={}) == "generic"
    assert isa.choose(library, v3, env={isa.ENV: "generic"}) == "generic"
    assert isa.choose(library, v3, env={isa.ENV: "avx2"}) == "avx2"
    assert isa.choose(library, v3, env={}) == (built_variants(library) or ["generic"])[0]
    with pytest.raises(RuntimeError, match=r"CFMTRAIN_CPU_ARCH=avx2: this CPU lacks bmi2 fma"):
        isa.choose(library, v3 - {"fma", "bmi2"}, env={isa.ENV: "avx2"})
    with pytest.warns(UserWarning, match=r"cfmtrain\._ops_missing_avx2 is not built: using"):
        assert isa.choose("cfmtrain._ops_missing", v3, env={}) == "generic"


def test_cpu_flags_from_a_cpuinfo_file(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2\n\nprocessor\t: 1\n"
                       "flags\t\t: fpu\n")
    assert isa.cpu_flags(cpuinfo) == {"fpu", "sse2", "avx2"}
    cpuinfo.write_text("Processor\t: AArch64\nFeatures\t: fp asimd\n")
    assert isa.cpu_flags(cpuinfo) == frozenset()
    assert isa.cpu_flags(tmp_path / "missing") == frozenset()


def test_a_library_not_built_is_named(monkeypatch):
    monkeypatch.setenv(isa.ENV, "generic")
    with pytest.raises(ImportError, match=r"cfmtrain\._ops_missing is not built: run"):
        load_ops("cfmtrain._ops_missing")


def test_bench_isa_compares_each_variant_with_generic():
    """bench isa's table: medians over rounds, paired speed-ups and result differences against
    generic."""
    from cfmtrain.bench.isa import _summarise

    config = {"op": "conv", "atoms": 8}
    prints = {"generic": {"out": [2.0, 1.0]}, "avx2": {"out": [2.0, 1.002]}}
    runs = {(0, v): [{"edges": 10, "median_s": t, "min_s": t / 2, "median_cpu_s": 2 * t,
                      "fingerprint": prints[v]} for t in times]
            for v, times in (("generic", [4.0, 6.0, 5.0]), ("avx2", [1.0, 3.0, 2.0]))}
    rows = {r["variant"]: r for r in _summarise(runs, [config])}
    assert rows["generic"]["median_s"] == 5.0 and rows["avx2"]["median_s"] == 2.0
    assert rows["avx2"]["min_s"] == 0.5 and rows["avx2"]["rounds"] == 3
    assert rows["avx2"]["speedup_vs_generic"] == rows["avx2"]["cpu_speedup_vs_generic"] == 2.5
    assert rows["generic"]["speedup_vs_generic"] == 1.0
    # per round: 4 / 1, 6 / 3, 5 / 2: the median of the rounds' ratios and its range
    assert [rows["avx2"][k] for k in ("ratio_median", "ratio_p10", "ratio_p90", "rounds")] == \
        pytest.approx([2.5, 2.1, 3.7, 3])
    assert rows["avx2"]["max_rel_diff_vs_generic"] == pytest.approx(0.001)
