"""Every public entry point imports in a fresh interpreter, in any order with mace and e3nn, and
importing cfmtrain leaves torch.load's weights-only safety as it was."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from cfmtrain.cli import COMMANDS

# The README's imports and the modules behind its other entry points, each alone and in orders
# with mace and e3nn. Once the first failed: e3nn's `constants.pt` was refused by
# torch's weights-only default unless `mace` (which switches it off) had been imported first.
STATEMENTS = [
    "from cfmtrain.kernels import fuse_model, unfuse_model, kernel_backend, choose_backend",
    "from cfmtrain.kernels import fuse_model, prepare_for_compile, without_codegen",
    "import cfmtrain.kernels.conv, cfmtrain.kernels.symmetric_contraction, cfmtrain.kernels.cueq",
    "from cfmtrain.balance import pack_bins, DistributedBinPackSampler",
    "from cfmtrain.balance import DistributedBinPackSampler, PaddingWeightedDataset",
    "from cfmtrain.graphs import GraphStore",
    "import cfmtrain.frames.validate",
    "from cfmtrain.train.loop import train_step",
    "import cfmtrain.bench.flops",
    "import cfmtrain; from e3nn import o3; o3.wigner_3j(1, 1, 2)",
    "from cfmtrain.kernels import fuse_model; import mace; from mace import modules",
    "import mace; from cfmtrain.kernels import fuse_model",
] + [f"import {module}" for module, _, _ in COMMANDS.values()]  # `cfmtrain <command>`


def run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (this one's venv), from a directory without the sources."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd="/", env=env, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("statement", STATEMENTS)
def test_entry_point_imports_in_a_fresh_interpreter(statement):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    result = run_python(statement, env)
    assert result.returncode == 0, result.stderr[-3000:]


def test_python_m_cfmtrain_help():
    result = subprocess.run([sys.executable, "-m", "cfmtrain", "--help"], capture_output=True,
                            text=True, cwd="/", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


class _Malicious:
    """Unpickling it would create a directory: torch.load's weights-only default must refuse."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


@pytest.mark.slow
def test_importing_cfmtrain_keeps_torch_load_safe(tmp_path):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    torch.save({"x": _Malicious(str(marker))}, evil, pickle_protocol=pickle.DEFAULT_PROTOCOL)
    code = textwrap.dedent(f"""
        import os, pickle, sys
        import torch
        before = set(torch.serialization.get_safe_globals())
        from cfmtrain.kernels import fuse_model
        from cfmtrain.graphs import GraphStore
        from cfmtrain.balance import pack_bins
        from e3nn import o3
        assert "mace" not in sys.modules, "cfmtrain.kernels imported mace at import time"
        assert os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD") is None
        assert set(torch.serialization.get_safe_globals()) == before
        assert slice not in torch.serialization.get_safe_globals()
        assert not any("E3nn" in type(f).__name__ for f in sys.meta_path)  # hook gone once used
        try:
            torch.load({str(evil)!r})
        except pickle.UnpicklingError as error:
            assert "weights" in str(error).lower(), error
        else:
            sys.exit("torch.load ran a pickle's code with default arguments")
        print("refused")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "refused"
    assert not marker.exists()


@pytest.mark.slow
def test_a_slice_allowed_before_cfmtrain_stays_allowed():
    code = textwrap.dedent("""
        import torch
        torch.serialization.add_safe_globals([slice])
        import cfmtrain.kernels
        assert slice in torch.serialization.get_safe_globals()
    """)
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
