# Two commands: `make run` (setup + the default pipeline on the embedded `mini` data) and
# `make test` (setup + ruff + the test suite). Both need only PyPI.
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: setup run test lint

setup:
	bash scripts/setup.sh

run: setup
	snakemake --profile profiles/local

test: setup
	ruff check .
	python -m pytest -q

lint:
	ruff check .
	snakemake --lint
