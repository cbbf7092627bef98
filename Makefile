# The two commands that do all set-up on a fresh machine (as root): `make test` and `make demo`.
SHELL := /bin/bash
VENV := .venv
PYTEST_ARGS ?=

.PHONY: setup test test-unit typecheck test-slurm24 test-slurm26 lint demo bench clean

setup:
	@scripts/setup.sh

# The habits first (lint, types: seconds), then the whole suite on TEST_WORKERS pytest-xdist
# workers, each with its own sandboxes (tests/conftest.py groups the cluster tests; most of
# their time is waiting on Slurm and restarts). `make test TEST_WORKERS=0`: one process.
TEST_WORKERS ?= 3
test: setup lint typecheck
	RESILIENT_REQUIRE_SLURM=1 $(VENV)/bin/pytest -q --durations=15 -n $(TEST_WORKERS) \
		--dist loadgroup $(PYTEST_ARGS)

# The fast subset: no Slurm, no training jobs, no wheel build (tests/conftest.py marks them
# `unit`); a test that starts the sandbox without its `slurm` marker fails here.
test-unit: setup
	RESILIENT_NO_SLURM=1 $(VENV)/bin/pytest -q -m unit --durations=10 $(PYTEST_ARGS)

# mypy on the installed product and lab (their strict editable link trees: first-party imports
# resolve), then on the tests with their settings (pyproject.toml: unannotated tests allowed, the modules
# not typed yet listed).
typecheck: setup
	$(VENV)/bin/mypy -p resilient_slurm
	$(VENV)/bin/mypy -p resilient_slurm_lab
	$(VENV)/bin/mypy tests

# The Slurm-facing and the launcher's cluster tests again in a cached Debian root
# (docs/slurm-versions.md); need root and debootstrap (installed if missing).
# Slurm 24.11 + nvidia-resiliency-ext 0.6 on Debian 13, with this machine's Python 3.11:
test-slurm24:
	scripts/slurm-stage/stage.sh slurm24 $(PYTEST_ARGS)

# Slurm 26.05 + nvidia-resiliency-ext 0.7 on Debian sid, with its Python 3.14 and CPU torch:
test-slurm26:
	scripts/slurm-stage/stage.sh slurm26 $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

demo: setup
	$(VENV)/bin/python scripts/demo.py

bench: setup
	$(VENV)/bin/python bench/run_all.py

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache
