# Two commands: `make run` (setup + the default pipeline on the embedded `mini` data) and
# `make test` (setup + Debian's Slurm for the real-Slurm test + the test suite).
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: setup run test lint

setup:
	bash scripts/setup.sh

run: setup
	snakemake --profile profiles/local

test: setup
	bash scripts/slurm/install.sh
	ruff check .
	python -m pytest -q

lint:
	ruff check .
	snakemake --lint
