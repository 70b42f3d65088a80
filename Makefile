# Two commands: `make run` (setup + the default pipeline on the embedded `mini` data) and
# `make test` (setup + Debian's Slurm + ruff + the test suite; CFMTRAIN_SKIP_SLURM=1 skips the
# Slurm install and its test). Both need only PyPI (and Debian's packages for Slurm).
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: setup run test lint

setup:
	bash scripts/setup.sh

run: setup
	snakemake --profile profiles/local

test: setup
	@# Debian's Slurm for tests/test_slurm.py (needs root or sudo, and apt)
	@if [ "$${CFMTRAIN_SKIP_SLURM:-}" = 1 ]; then \
	    echo "CFMTRAIN_SKIP_SLURM=1: not installing Slurm"; \
	else \
	    bash scripts/slurm/install.sh; \
	fi
	ruff check .
	python -m pytest -q

lint:
	ruff check .
	snakemake --lint
