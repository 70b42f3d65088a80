"""Setting cfmtrain up for GPUs: `make setup`'s plan for a CUDA torch (CFMTRAIN_TORCH=cu126:
torch pinned from PyTorch's CUDA index, cuEquivariance's CUDA ops, every pip call constrained to
the one torch), and the offline route run here for this machine's Python: `make gpu-wheels`'
download (no torch, no NVIDIA library), scripts/gpu_node_setup.sh installing it with --no-index
into a venv over a "node" Python that has torch only, and the gpu-check's CPU part run there
without the compiled extension."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from importlib.metadata import distribution
from pathlib import Path

import pandas as pd
import pytest
from helpers import REPO
from packaging.requirements import Requirement

PIN = "torch==2.13.0"


def plan(build: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "CFMTRAIN_SETUP_PLAN": "1"}
    env.pop("CFMTRAIN_TORCH", None)
    if build is not None:
        env["CFMTRAIN_TORCH"] = build
    return subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("build,index,ops", [
    (None, None, None),
    ("cpu", None, None),
    ("cu126", "https://download.pytorch.org/whl/cu126", "cuequivariance-ops-torch-cu12==0.13.0"),
    ("cu128", "https://download.pytorch.org/whl/cu128", "cuequivariance-ops-torch-cu12==0.13.0"),
    ("cu130", "https://download.pytorch.org/whl/cu130", "cuequivariance-ops-torch-cu13==0.13.0"),
])
def test_setup_pins_torch_and_adds_the_cuda_ops_for_a_cuda_build(build, index, ops):
    result = plan(build)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    pips = [shlex.split(line) for line in lines if line.startswith(".venv/bin/pip install")]
    assert all(words[2:5] == ["--quiet", "-c", "envs/torch-constraints.txt"] for words in pips)
    first = pips[0]
    assert first[-1] == PIN and (first[-3:-1] == ["--index-url", index] if index
                                 else "--index-url" not in first)
    torch_words = [w for words in pips for w in words if re.match(r"torch\b", w)]
    assert torch_words == [PIN]  # nothing else names torch: no unpinned one can come
    named_ops = [w for words in pips for w in words if w.startswith("cuequivariance-ops")]
    assert named_ops == ([ops] if ops else [])
    checks = [line for line in lines if line.startswith(".venv/bin/python -c")]
    wanted = "torch.version.cuda is None" if index is None else f"== '{build[2:]}'"
    assert len(checks) == 2 and all(wanted in c for c in checks)  # right after torch, and last
    assert "--no-build-isolation -e .[test]" in result.stdout


def test_setup_refuses_an_unknown_build():
    result = plan("rocm6")
    assert result.returncode == 2 and "expected cpu or a CUDA build" in result.stderr


def test_the_constraint_is_pyprojects_torch():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    constraints = [line for line in (REPO / "envs/torch-constraints.txt").read_text().splitlines()
                   if line and not line.startswith("#")]
    assert constraints == [PIN]
    assert PIN in project["project"]["dependencies"]
    assert PIN in project["build-system"]["requires"]


def test_make_gpu_wheels_runs_the_download_script():
    result = subprocess.run(["make", "--no-print-directory", "-n", "gpu-wheels",
                             "PYTHON_VERSION=3.11", "CUDA=cu13",
                             "GPU_WHEELS=somewhere"], cwd=REPO, capture_output=True, text=True)
    recipe = result.stdout.replace("\\\n", " ").splitlines()[-1]
    assert shlex.split(recipe) == ["python", "scripts/gpu_wheels.py", "--python-version", "3.11",
                                   "--cuda", "cu13", "--dest", "somewhere"]


def test_make_gpu_check_runs_bench_gpu_in_the_node_venv_else_in_dot_venv(tmp_path):
    """The node venv's Python where it exists (one that prints its arguments stands in), else
    `python`, .venv's (the Makefile puts .venv/bin first on PATH)."""
    python = tmp_path / "gpu" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "$@"\n')
    python.chmod(0o755)
    ran = subprocess.run(["make", "--no-print-directory", "gpu-check",
                          f"GPU_VENV={tmp_path / 'gpu'}"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert ran.stdout.splitlines() == [f"{python} -m cfmtrain bench gpu",
                                       "-m cfmtrain bench gpu"]
    planned = subprocess.run(["make", "--no-print-directory", "-n", "gpu-check",
                              f"GPU_VENV={tmp_path / 'none'}"],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "py=python; fi" in planned.stdout and "$py -m cfmtrain bench gpu" in planned.stdout


def torch_only_python(folder: Path) -> Path:
    """A Python with torch and what torch needs, nothing else (no numpy, no mace): a GPU node's
    own PyTorch stands in; its packages are this environment's, linked."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    purelib = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                   "['purelib'])"], capture_output=True, text=True,
                                  check=True).stdout.strip())
    seen, queue = set(), ["torch"]
    while queue:
        dist = distribution(queue.pop())
        name = dist.metadata["Name"].lower()
        if name in seen:
            continue
        seen.add(name)
        queue += [r.name for r in map(Requirement, dist.requires or [])
                  if r.marker is None or r.marker.evaluate({"extra": ""})]
        for top in {str(f).split("/")[0] for f in dist.files or []}:
            target = purelib / top
            if not top.startswith("..") and top not in ("__pycache__",) \
                    and not top.endswith(".pth") and not target.exists():
                target.symlink_to(dist.locate_file(top))
    return python


@pytest.mark.slow
def test_offline_wheels_set_a_node_venv_up_without_the_extension(tmp_path):
    wheels = tmp_path / "wheels"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    done = subprocess.run([sys.executable, "scripts/gpu_wheels.py", "--python-version", version,
                           "--cuda", "cu12", "--dest", str(wheels)], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    names = [p.name.lower() for p in wheels.glob("*.whl")]
    # torch, its CUDA libraries and triton are the node's (nvidia-ml-py, NVML's Python binding,
    # is cuEquivariance's own dependency)
    projects = [n.split("-")[0] for n in names]
    assert not [p for p in projects if p in ("torch", "triton")
                or (p.startswith("nvidia_") and p != "nvidia_ml_py")], projects
    required = (wheels / "requirements.txt").read_text()
    for package in ("mace-torch==", "cuequivariance==", "cuequivariance-torch==",
                    "cuequivariance-ops-torch-cu12==", "e3nn==", "h5py=="):
        assert f"\n{package}" in required, package

    node = torch_only_python(tmp_path / "node")
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "CFMTRAIN_"))}
    env["PIP_CONFIG_FILE"] = os.devnull  # no index, no find-links but the wheels folder
    env["PYTHON"] = str(node)
    done = subprocess.run(["bash", "scripts/gpu_node_setup.sh", str(wheels), str(venv)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "cfmtrain ready on" in done.stdout

    python = venv / "bin" / "python"
    where = subprocess.run([python, "-c", "import cfmtrain, torch, mace, os; print(cfmtrain."
                            "__file__, torch.__file__, mace.__file__, os.environ.get("
                            "'CFMTRAIN_NO_EXTENSION'))"], env=env, capture_output=True,
                           text=True, check=True).stdout.split()
    assert where[0].startswith(str(REPO / "src")) and where[1].startswith(str(tmp_path / "node"))
    assert where[2].startswith(str(venv)) and where[3] == "1"
    done = subprocess.run([python, "-m", "cfmtrain", "bench", "gpu"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "no GPU: device parts skipped"
    table = pd.read_csv(tmp_path / "results/bench/gpu_check.csv")
    assert table["ok"].all() and len(table) == 16
