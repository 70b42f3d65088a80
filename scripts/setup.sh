#!/usr/bin/env bash
# Creates .venv with torch pinned first (envs/torch-constraints.txt, passed to every pip call so
# that no dependency pulls another torch), then installs cfmtrain editable, compiling kernels/
# without build isolation (an isolated build would fetch a multi-GB torch).
#
# CFMTRAIN_TORCH picks torch's build: `cpu` (the default: PyPI's torch==2.13.0, which resolves to
# the CPU wheel where pip is configured so, e.g. this project's CI) or a CUDA build, `cu126`,
# `cu128`, `cu130`, ... (from download.pytorch.org/whl/<it>), which adds cuEquivariance's CUDA
# ops (cuequivariance-ops-torch-cu12 or -cu13, from PyPI). The build installed is checked.
# CFMTRAIN_SETUP_PLAN=1 prints the commands instead of running them.
#
# A .venv already set up from the same inputs (this script, pyproject.toml, setup.py, kernels/,
# the Python version, CFMTRAIN_CPU_ARCH and CFMTRAIN_TORCH) whose packages and compiled ops import
# is kept as it is: `make run` and `make test` then skip ~2.5 minutes of pip.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
build=${CFMTRAIN_TORCH:-cpu}
plan=${CFMTRAIN_SETUP_PLAN:-}
constraints=envs/torch-constraints.txt
torch_pin=$(grep -E '^torch==' "$constraints")
cueq=$(grep -oE 'cuequivariance-torch==[0-9.]+' pyproject.toml | cut -d= -f3)
case "$build" in
    cpu) index=() ops=() cuda_check='torch.version.cuda is None' ;;
    cu12[0-9]|cu13[0-9])
        index=(--index-url "https://download.pytorch.org/whl/$build")
        ops=("cuequivariance-ops-torch-${build:0:4}==$cueq")
        cuda_check="torch.version.cuda is not None and torch.version.cuda.replace('.', '')[:3] == '${build:2}'" ;;
    *) echo "CFMTRAIN_TORCH=$build: expected cpu or a CUDA build such as cu126, cu128, cu130" >&2
       exit 2 ;;
esac

run() {  # a command, or with CFMTRAIN_SETUP_PLAN=1 its line
    if [ -n "$plan" ]; then echo "$*"; else "$@"; fi
}

stamp=.venv/.cfmtrain-setup
check='import cfmtrain, torch, mace, cfmtrain._balance, cfmtrain.kernels.conv, cfmtrain.kernels.symmetric_contraction; assert '"$cuda_check"', "torch " + torch.__version__ + " is not the '"$build"' build"; print("cfmtrain ready: torch", torch.__version__)'
if [ -z "$plan" ]; then
    [ -x .venv/bin/python ] || "$python" -m venv .venv
    inputs=$(bash scripts/setup_inputs.sh .venv/bin/python)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs" ] && .venv/bin/python -c "$check" 2>/dev/null; then
        echo "cfmtrain set-up up to date (.venv from the same inputs): skipping pip"
        exit 0
    fi
    rm -f "$stamp"
else
    echo "$python -m venv .venv"
fi
pip=(.venv/bin/pip install --quiet -c "$constraints")
run "${pip[@]}" "${index[@]}" "$torch_pin"
# the build asked for, or stop before the rest: PyPI's torch is a CUDA build where pip is not
# configured for the CPU one (then: pip install torch==2.13.0 --index-url
# https://download.pytorch.org/whl/cpu into .venv, and run this again)
run .venv/bin/python -c "import torch; assert $cuda_check, 'torch ' + torch.__version__ + ' is not the $build build'"
if [ ${#ops[@]} -gt 0 ]; then run "${pip[@]}" "${ops[@]}"; fi
run "${pip[@]}" "setuptools>=69" wheel "pybind11>=2.12" ninja
run "${pip[@]}" --no-build-isolation -e '.[test]'
run .venv/bin/python -c "$check"
if [ -z "$plan" ]; then echo "$inputs" > "$stamp"; fi
