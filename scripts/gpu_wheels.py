"""Download the wheels an offline GPU node needs for cfmtrain (`make gpu-wheels`): mace-torch,
cuequivariance, cuequivariance-torch, cuEquivariance's CUDA ops for CUDA 12 or 13, cfmtrain's
runtime dependencies and all of theirs, for the node's Python and platform; never torch, its
NVIDIA libraries or triton, which the node's own CUDA torch provides.

pip resolves the set for the target (`--python-version`, `--platform`, binaries only) with torch
and cuBLAS standing in as empty wheels, so nothing of the node's torch is fetched, and with the
versions of this machine's .venv as constraints where it has the package (the versions tested
here). A pure-Python dependency published as a source archive only is built here into a wheel.
The folder gets the wheels and requirements.txt (name==version of each), which
scripts/gpu_node_setup.sh installs with `pip install --no-index --no-deps`.

    python scripts/gpu_wheels.py --python-version 3.12 --cuda cu12 --dest gpu-wheels
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = {"x86_64": ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"),
             "aarch64": ("manylinux_2_28_aarch64", "manylinux_2_17_aarch64",
                         "manylinux2014_aarch64")}
# what a CUDA torch environment holds, stood in for by empty wheels (cuBLAS: cuEquivariance's
# CUDA ops need it, under its CUDA 12 and CUDA 13 names)
PROVIDED = {"torch": None, "nvidia-cublas-cu12": "12.99", "nvidia-cublas": "13.99"}
# cfmtrain's dependencies a node does not need: the build (it installs without the extension)
# and the workflow (Snakemake runs where `make setup` ran; the node runs cfmtrain)
NOT_ON_NODE = ("torch", "pybind11", "ninja", "snakemake", "snakemake-executor-plugin-slurm")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def digest(text: str) -> str:
    """A wheel RECORD's hash of `text`."""
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()


def wheels_in(folder: Path) -> set[tuple[str, str]]:
    """(name, version) of the wheels in `folder`."""
    return {(canonical(p.name.split("-")[0]), p.name.split("-")[1]) for p in folder.glob("*.whl")}


def stub_wheel(folder: Path, name: str, version: str) -> Path:
    """An empty wheel that only says `name` `version` is installed (no files, no dependencies)."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: cfmtrain\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    record = "".join(f"{path},sha256={digest(text)},{len(text)}\n" for path, text in files.items())
    files[f"{info}/RECORD"] = record + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
    return path


def pins(project: dict, cuda: str) -> list[str]:
    """What the node installs: cfmtrain's runtime dependencies with the GPU packages (the CUDA
    ops at cuequivariance-torch's version), setuptools and wheel (to install cfmtrain itself)."""
    deps = [d for d in project["dependencies"]
            if canonical(re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0]) not in NOT_ON_NODE]
    version = next(d.split("==")[1] for d in deps if d.startswith("cuequivariance-torch=="))
    return [*deps, f"cuequivariance-ops-torch-{cuda}=={version}", "setuptools>=69", "wheel"]


def installed_versions() -> dict[str, str]:
    """name -> version of what this interpreter has (the tested versions)."""
    from importlib.metadata import distributions

    return {canonical(d.metadata["Name"]): d.version for d in distributions()
            if d.metadata["Name"]}


def target_args(python_version: str, platforms: tuple[str, ...]) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for platform in platforms:
        args += ["--platform", platform]
    return args


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def resolve(requirements: list[str], stubs: list[Path], constraints: Path, target: list[str],
            dest: Path, work: Path) -> list[dict]:
    """pip's resolution for the target: [{name, version}] of every package but the stubs;
    source-only pure-Python packages are built into `dest` on the way."""
    for _ in range(20):
        report = work / "report.json"
        done = pip("install", "--dry-run", "--ignore-installed", "--report",
                   str(report), *target, "--target", str(work / "target"), "--find-links",
                   str(stubs[0].parent), "--find-links", str(dest), "-c", str(constraints),
                   *map(str, stubs), *requirements)
        if done.returncode == 0:
            stubbed = {canonical(s.name.split("-")[0]) for s in stubs}
            return [{"name": canonical(item["metadata"]["name"]),
                     "version": item["metadata"]["version"]}
                    for item in json.loads(report.read_text())["install"]
                    if canonical(item["metadata"]["name"]) not in stubbed]
        # a package without a wheel for the target: said so, or (when constrained) a conflict
        missing = (re.search(r"No matching distribution found for ([A-Za-z0-9_.\-]+)", done.stderr)
                   or re.search(r"user requested \(constraint\) ([A-Za-z0-9_.\-]+)==",
                                done.stdout + done.stderr))
        if not missing:
            raise SystemExit(f"pip could not resolve the node's packages:\n{done.stderr[-3000:]}")
        build_pure_wheel(missing.group(1), constraints, dest)
    raise SystemExit("too many packages without a wheel")


def build_pure_wheel(name: str, constraints: Path, dest: Path) -> None:
    """A wheel of `name` (at the constrained version) built here; only a pure-Python one fits."""
    print(f"{name}: no wheel for the target on the index: building it from its source")
    done = pip("wheel", "--quiet", "--no-deps", "--no-binary", name, "-c", str(constraints),
               "-w", str(dest), name)
    built = sorted(dest.glob(f"{name.replace('-', '_')}-*.whl"), key=lambda p: p.stat().st_mtime)
    if done.returncode or not built or not built[-1].name.endswith("-none-any.whl"):
        raise SystemExit(f"{name}: no wheel for the node and no pure-Python build of it\n"
                         f"{done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", required=True, help="the node's, e.g. 3.12")
    parser.add_argument("--cuda", choices=("cu12", "cu13"), required=True,
                        help="CUDA major version of the node's torch")
    parser.add_argument("--dest", type=Path, default=ROOT / "gpu-wheels")
    parser.add_argument("--arch", choices=sorted(PLATFORMS), default="x86_64")
    parser.add_argument("--torch", default=None,
                        help="the node's torch version (default: the pinned one)")
    args = parser.parse_args(argv)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_pin = next(d.split("==")[1] for d in project["dependencies"] if d.startswith("torch=="))
    dest = args.dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    target = target_args(args.python_version, PLATFORMS[args.arch])
    with tempfile.TemporaryDirectory(prefix="cfmtrain-gpu-wheels-") as tmp:
        work = Path(tmp)
        (work / "stubs").mkdir()
        stubs = [stub_wheel(work / "stubs", name, version or args.torch or torch_pin)
                 for name, version in PROVIDED.items()]
        here = installed_versions()
        constraints = work / "constraints.txt"
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in here.items()
                                       if name not in PROVIDED and name != "cfmtrain"))
        packages = resolve(pins(project, args.cuda), stubs, constraints, target, dest, work)
    have = wheels_in(dest)
    fetch = [f"{p['name']}=={p['version']}" for p in packages
             if (p["name"], p["version"]) not in have]
    if fetch:
        done = pip("download", "--quiet", "--no-deps", *target, "-d", str(dest), *fetch)
        if done.returncode:
            raise SystemExit(f"pip download failed:\n{done.stderr[-3000:]}")
    lines = sorted(f"{p['name']}=={p['version']}" for p in packages)
    (dest / "requirements.txt").write_text(
        f"# cfmtrain's GPU node packages for CPython {args.python_version}, {args.arch}, "
        f"{args.cuda} (scripts/gpu_wheels.py); the node provides torch\n" + "\n".join(lines)
        + "\n")
    size = sum(p.stat().st_size for p in dest.glob("*.whl"))
    print(f"{dest}: {len(lines)} packages, {size / 1e6:.0f} MB of wheels; on the node: "
          f"bash scripts/gpu_node_setup.sh {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
