"""cfmtrain without its compiled extension, as a GPU node installs it: every module imports from a
copy of the package that holds no compiled file; the CPU kernels, the CPU batch assembly and the
CPU packing refuse by name; cuEquivariance runs both kernels; and a training whose batches and
plans come from the Python twins (CFMTRAIN_NO_EXTENSION=1) ends with the very same weights and
losses as one with the compiled pieces."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import COMMON, REPO

CHECKS = r'''
import importlib, pkgutil, sys, warnings
import torch
import cfmtrain
assert cfmtrain.__file__.startswith(sys.argv[1]), cfmtrain.__file__
failed = []
for info in pkgutil.walk_packages(cfmtrain.__path__, "cfmtrain."):
    if info.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(info.name)
    except Exception as err:
        failed.append(f"{info.name}: {err!r}")
assert not failed, failed
assert not [m for m in sys.modules if m.startswith("cfmtrain._")], "a compiled module loaded"

def refuses(call, text):
    try:
        call()
    except ImportError as err:
        assert text in str(err), str(err)
    else:
        raise AssertionError(f"no ImportError: {text}")

from cfmtrain.balance.pack import pack_plan, packing_backend
from cfmtrain.batches.assembly import assembly_backend
from cfmtrain.kernels import fuse_model, kernel_backend
from cfmtrain.bench.kernels_worker import make_batch, paper_model, supercell
model = paper_model(torch.float64, False, size="tiny")
refuses(lambda: fuse_model(model), "the fused CPU kernels are not built")
refuses(lambda: fuse_model(model, backend="cpu-fused"), "_ops_channelwise_conv")
from cfmtrain.kernels.conv import _OPS
refuses(lambda: _OPS.channelwise_conv_gather(),
        "_ops_channelwise_conv is not built (needed for cfmtrain::channelwise_conv_gather")
refuses(lambda: assembly_backend("cpu"), "cfmtrain._ops_batch_assembly is not built")
refuses(lambda: packing_backend("cpu"), "cfmtrain._balance is not built (Algorithm 1)")
refuses(lambda: pack_plan([1, 2], 3, 1), "cfmtrain._balance is not built")
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    assert assembly_backend("cuda") == "torch" and packing_backend("cuda") == "portable"
batch = make_batch(supercell(16), torch.float64)
want = model(dict(batch), training=False, compute_force=True)["forces"]
fuse_model(model, backend="cueq")
assert kernel_backend(model) == {"symmetric_contraction": "cueq", "conv": "cueq"}
got = model(dict(batch), training=False, compute_force=True)["forces"]
assert (got - want).abs().max() < 1e-8 * want.abs().max(), "cueq differs"
print("checked")
'''


@pytest.mark.slow
def test_a_copy_without_compiled_files_imports_refuses_the_cpu_kernels_and_runs_cueq(tmp_path):
    shutil.copytree(REPO / "src", tmp_path / "src",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info"))
    assert not list((tmp_path / "src").rglob("*.so"))
    env = {k: v for k, v in os.environ.items() if k != "CFMTRAIN_NO_EXTENSION"}
    env["PYTHONPATH"] = str(tmp_path / "src")
    result = subprocess.run([sys.executable, "-c", CHECKS, str(tmp_path / "src")], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "checked" in result.stdout, result.stderr[-4000:]


def train(data, out: Path, no_extension: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CFMTRAIN_NO_EXTENSION"}
    if no_extension:
        env["CFMTRAIN_NO_EXTENSION"] = "1"
    args = ["--graphs", str(data[0]), "--split", str(data[1]), "--output", str(out)]
    for override in (*COMMON, "variant=balancer", "batch.capacity=auto"):
        args += ["--set", override]
    return subprocess.run([sys.executable, "-m", "cfmtrain", "train", *args], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_python_twins_train_exactly_as_the_compiled_pieces(data, tmp_path):
    runs = {}
    for no_extension in (False, True):
        out = tmp_path / ("python" if no_extension else "compiled")
        result = train(data, out, no_extension)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[no_extension] = out
    provenance = {k: json.loads((out / "summary.json").read_text())["provenance"]
                  for k, out in runs.items()}
    assert provenance[False]["host_backend"] == {"batch_assembly": "compiled",
                                                 "packing": "compiled"}
    assert provenance[True]["host_backend"] == {"batch_assembly": "torch",
                                                "packing": "portable"}
    steps = [(out / "steps.csv").read_text().splitlines() for out in runs.values()]
    columns = steps[0][0].split(",")
    keep = [columns.index(c) for c in ("epoch", "step", "graphs", "atoms", "edges", "loss")]
    assert [[line.split(",")[k] for k in keep] for line in steps[0]] == \
        [[line.split(",")[k] for k in keep] for line in steps[1]]
    weights = [torch.load(out / "final.model", weights_only=False).state_dict()
               for out in runs.values()]
    for name, value in weights[0].items():
        assert torch.equal(value, weights[1][name]), name
