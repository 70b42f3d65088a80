#!/usr/bin/env bash
# Prints one hash of what scripts/setup.sh builds .venv from: the set-up script, pyproject.toml,
# setup.py, envs/torch-constraints.txt, every file under kernels/, the Python version of $1,
# CFMTRAIN_CPU_ARCH and CFMTRAIN_TORCH.
set -euo pipefail
cd "$(dirname "$0")/.."
{
    "$1" --version
    echo "CFMTRAIN_CPU_ARCH=${CFMTRAIN_CPU_ARCH:-}"
    echo "CFMTRAIN_TORCH=${CFMTRAIN_TORCH:-cpu}"
    find scripts/setup.sh pyproject.toml setup.py envs/torch-constraints.txt kernels -type f \
        -print0 | LC_ALL=C sort -z | xargs -0 sha1sum
} | sha1sum | cut -d' ' -f1
