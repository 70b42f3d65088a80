#!/usr/bin/env bash
# The workflow checks, once, as their own step of `make test` (`make lint` runs the first):
#   1. `snakemake --lint` finds nothing;
#   2. a dry run (-n --forceall) of every target -- the Snakefile's own rules, `all` first --
#      plans on the default config, on config/paper.yaml and on the tiny tests/.test/config.yaml
#      (given on top of the default).
# Only that they lint and plan: what the plans hold (jobs per rule, priorities, resources,
# command lines) is checked in tests/workflow/test_workflow.py and the other tests marked `workflow`.
# Usage: bash scripts/check_workflow.sh [--lint-only]
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}  # `make setup`'s
[ -x "$python" ] || python=python
log=$(mktemp)
trap 'rm -f "$log"' EXIT

step() {  # step NAME COMMAND...: run it quietly; its output only when it fails
    local start=$SECONDS
    if ! "${@:2}" >"$log" 2>&1; then
        cat "$log"
        echo "check_workflow: $1: FAILED" >&2
        exit 1
    fi
    echo "check_workflow: $1: ok ($((SECONDS - start)) s)"
}

lint() {
    "$python" -m snakemake --lint && grep -q "Congratulations" "$log"
}
step "snakemake --lint" lint
[ "${1:-}" = --lint-only ] && exit 0

# the targets: every rule of the Snakefile itself (the stages' rules live in workflow/rules/)
mapfile -t targets < <(sed -n 's/^rule \([A-Za-z_][A-Za-z_0-9]*\):.*/\1/p' Snakefile)
[ "${targets[0]:-}" = all ] && [ "${#targets[@]}" -gt 5 ] || {
    echo "check_workflow: no targets read from the Snakefile: ${targets[*]}" >&2; exit 1; }

for config in config/config.yaml config/paper.yaml tests/.test/config.yaml; do
    step "dry run of ${#targets[@]} targets on $config" \
        "$python" -m snakemake -n --forceall "${targets[@]}" --configfile "$config"
done
