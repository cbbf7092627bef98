# The two commands that do all set-up on a fresh machine (as root): `make test` and `make demo`.
SHELL := /bin/bash
VENV := .venv
PYTEST_ARGS ?=

.PHONY: setup test test-unit typecheck test-slurm24 lint demo bench clean

setup:
	@scripts/setup.sh

test: setup typecheck
	RESILIENT_REQUIRE_SLURM=1 $(VENV)/bin/pytest -q --durations=15 $(PYTEST_ARGS)

# The fast subset: no Slurm, no training jobs, no wheel build (tests/conftest.py marks them
# `unit`); a test that starts the sandbox without its `slurm` marker fails here.
test-unit: setup
	RESILIENT_NO_SLURM=1 $(VENV)/bin/pytest -q -m unit --durations=10 $(PYTEST_ARGS)

# mypy on the installed package (the strict editable link tree: first-party imports resolve).
typecheck: setup
	$(VENV)/bin/mypy -p resilient_slurm

# The Slurm-facing tests again on Slurm 24.11 + nvidia-resiliency-ext 0.6 in a cached Debian 13
# root (docs/slurm-versions.md); needs root, debootstrap (installed if missing) and Python 3.11.
test-slurm24:
	scripts/slurm24/stage.sh $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

demo: setup
	$(VENV)/bin/python scripts/demo.py

bench: setup
	$(VENV)/bin/python bench/run_all.py

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache
