# Two commands: `make run` (setup + the default pipeline on the embedded `mini` data) and
# `make test` (setup + Debian's Slurm + ruff + the test suite). Both need only PyPI (and
# Debian's packages for Slurm).
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: setup run test lint

setup:
	bash scripts/setup.sh

run: setup
	snakemake --profile profiles/local

test: setup
	bash scripts/slurm/install.sh  # Debian's Slurm for tests/test_slurm.py (root or sudo, apt)
	ruff check .
	python -m pytest -q

lint:
	ruff check .
	snakemake --lint
