#!/usr/bin/env bash
# Creates .venv with the CPU build of torch pinned first, then installs cfmtrain editable,
# compiling kernels/ without build isolation (an isolated build would fetch a multi-GB torch).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/pip install --quiet torch==2.13.0
.venv/bin/pip install --quiet "setuptools>=69" wheel "pybind11>=2.12" ninja
.venv/bin/pip install --quiet --no-build-isolation -e '.[test]'
.venv/bin/python -c "import cfmtrain, torch, mace; print('cfmtrain ready: torch', torch.__version__)"
