#!/usr/bin/env bash
# Creates .venv with the CPU build of torch pinned first, then installs cfmtrain editable,
# compiling kernels/ without build isolation (an isolated build would fetch a multi-GB torch).
# A .venv already set up from the same inputs (this script, pyproject.toml, setup.py, kernels/,
# the Python version and CFMTRAIN_CPU_ARCH) whose packages and compiled ops import is kept as it
# is: `make run` and `make test` then skip ~2.5 minutes of pip.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
stamp=.venv/.cfmtrain-setup
[ -x .venv/bin/python ] || "$python" -m venv .venv
check='import cfmtrain, torch, mace, cfmtrain._balance, cfmtrain.kernels.conv, cfmtrain.kernels.symmetric_contraction; print("cfmtrain ready: torch", torch.__version__)'
inputs=$(bash scripts/setup_inputs.sh .venv/bin/python)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs" ] && .venv/bin/python -c "$check" 2>/dev/null; then
    echo "cfmtrain set-up up to date (.venv from the same inputs): skipping pip"
    exit 0
fi
rm -f "$stamp"
.venv/bin/pip install --quiet torch==2.13.0
.venv/bin/pip install --quiet "setuptools>=69" wheel "pybind11>=2.12" ninja
.venv/bin/pip install --quiet --no-build-isolation -e '.[test]'
.venv/bin/python -c "$check"
echo "$inputs" > "$stamp"
