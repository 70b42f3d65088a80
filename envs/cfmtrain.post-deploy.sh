#!/usr/bin/env bash
# Snakemake runs this once inside a newly created envs/cfmtrain.yaml environment
# (--software-deployment-method conda): installs cfmtrain itself, editable, compiling kernels/.
# Snakemake runs a copy (.snakemake/conda/<hash>.post-deploy.sh, or under --conda-prefix) from
# its working directory, so the repository is $CFMTRAIN_ROOT if set, else the first folder
# holding cfmtrain's pyproject.toml and a Snakefile in or above this script's folder, else in
# or above the working directory. An environment shared between clones (one --conda-prefix) holds
# the clone that created it: set CFMTRAIN_ROOT or give each clone its own prefix.
set -euo pipefail

is_root() {
    [ -f "$1/Snakefile" ] && [ -f "$1/pyproject.toml" ] \
        && grep -Eq '^name *= *"cfmtrain"' "$1/pyproject.toml"
}

find_root() {
    local dir
    dir=$(cd "$1" 2>/dev/null && pwd -P) || return 1
    while :; do
        if is_root "$dir"; then
            echo "$dir"
            return 0
        fi
        [ "$dir" = / ] && return 1
        dir=$(dirname "$dir")
    done
}

here=$(dirname "${BASH_SOURCE[0]}")
if [ -n "${CFMTRAIN_ROOT:-}" ]; then
    is_root "$CFMTRAIN_ROOT" || {
        echo "cfmtrain.post-deploy.sh: CFMTRAIN_ROOT=$CFMTRAIN_ROOT is not a cfmtrain" \
            "repository (no Snakefile, or no pyproject.toml naming cfmtrain)" >&2
        exit 1
    }
    root=$(cd "$CFMTRAIN_ROOT" && pwd -P)
elif ! root=$(find_root "$here") && ! root=$(find_root "$PWD"); then
    echo "cfmtrain.post-deploy.sh: no cfmtrain repository (a Snakefile and a pyproject.toml" \
        "naming cfmtrain) in or above $here or $PWD: run Snakemake from the repository" \
        "or set CFMTRAIN_ROOT" >&2
    exit 1
fi
echo "cfmtrain.post-deploy.sh: installing cfmtrain from $root"
# no build isolation: an isolated build would fetch another multi-GB torch to compile against
pip install --no-build-isolation -e "$root"
