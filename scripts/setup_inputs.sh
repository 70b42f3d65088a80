#!/usr/bin/env bash
# Prints one hash of what scripts/setup.sh builds .venv from: the set-up script, pyproject.toml,
# setup.py, every file under kernels/, the Python version of $1 and CFMTRAIN_CPU_ARCH.
set -euo pipefail
cd "$(dirname "$0")/.."
{
    "$1" --version
    echo "CFMTRAIN_CPU_ARCH=${CFMTRAIN_CPU_ARCH:-}"
    find scripts/setup.sh pyproject.toml setup.py kernels -type f -print0 | LC_ALL=C sort -z \
        | xargs -0 sha1sum
} | sha1sum | cut -d' ' -f1
