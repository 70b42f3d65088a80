# `make run` (setup + the default pipeline on the embedded `mini` data), `make check` (setup,
# ruff, lint-imports and the fast tier of the tests: a few minutes) and `make test` (setup +
# Debian's Slurm + ruff + lint-imports + the workflow checks + the whole test suite;
# CFMTRAIN_SKIP_SLURM=1 skips the Slurm install and its test). All need only PyPI (and Debian's
# packages for Slurm).
export PATH := $(CURDIR)/.venv/bin:$(PATH)

# The fast tier: every test but those marked (pyproject.toml's [tool.pytest.ini_options]) as
# running Snakemake, several processes, the local Slurm, or long.
FAST := not slow and not workflow and not dist and not slurm

.PHONY: setup run check test lint gpu-wheels gpu-check

# GPU nodes (docs/gpu.md). `make gpu-wheels` downloads the wheels an offline node needs, all but
# torch (the node's own): PYTHON_VERSION (the node's), CUDA (cu12 or cu13, its torch's),
# GPU_WHEELS (the folder). `make gpu-check` checks cuEquivariance on the GPU and times it
# (results/bench/gpu_check.csv), in GPU_VENV where scripts/gpu_node_setup.sh made it, else in
# .venv (CFMTRAIN_TORCH=cu126 make setup); without a GPU only its CPU part runs.
PYTHON_VERSION ?= 3.12
CUDA ?= cu12
GPU_WHEELS ?= gpu-wheels
GPU_VENV ?= .venv-gpu

setup:
	bash scripts/setup.sh

run: setup
	snakemake --profile profiles/local

check: setup
	ruff check .
	lint-imports
	@# the fast tier checks the generated docs too (tests/workflow/test_docs.py)
	python -m pytest -q -m "$(FAST)" --durations=10

test: setup
	@# Debian's Slurm for tests/workflow/test_slurm.py (needs root or sudo, and apt)
	@if [ "$${CFMTRAIN_SKIP_SLURM:-}" = 1 ]; then \
	    echo "CFMTRAIN_SKIP_SLURM=1: not installing Slurm"; \
	else \
	    bash scripts/slurm/install.sh; \
	fi
	ruff check .
	lint-imports
	@# snakemake --lint and a dry run of every target on the default, paper and tiny configs
	bash scripts/check_workflow.sh
	@# the generated docs are up to date, and the docs site builds without a warning
	cfmtrain docs --check
	mkdocs build --strict --quiet
	python -m pytest -q --durations=25

lint:
	ruff check .
	lint-imports
	bash scripts/check_workflow.sh --lint-only

gpu-wheels: setup
	python scripts/gpu_wheels.py --python-version $(PYTHON_VERSION) --cuda $(CUDA) \
	    --dest $(GPU_WHEELS)

gpu-check:
	@if [ -x $(GPU_VENV)/bin/python ]; then py=$(GPU_VENV)/bin/python; else py=python; fi; \
	    echo "$$py -m cfmtrain bench gpu"; $$py -m cfmtrain bench gpu
