# The two commands that do all set-up on a fresh machine (as root): `make test` and `make demo`.
SHELL := /bin/bash
VENV := .venv
PYTEST_ARGS ?=

.PHONY: setup test typecheck lint demo bench clean

setup:
	@scripts/setup.sh

test: setup typecheck
	RESILIENT_REQUIRE_SLURM=1 $(VENV)/bin/pytest -q --durations=15 $(PYTEST_ARGS)

# mypy on the installed package (the strict editable link tree: first-party imports resolve).
typecheck: setup
	$(VENV)/bin/mypy -p resilient_slurm

lint: setup
	$(VENV)/bin/ruff check .

demo: setup
	$(VENV)/bin/python scripts/demo.py

bench: setup
	$(VENV)/bin/python bench/run_all.py

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache
