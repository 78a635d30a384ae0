# Two entry points for a fresh machine (see README): `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint bench clean

$(BIN)/gctl: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m compileall -q gctl controller nodeagent migrations > /dev/null
	touch $@

setup: $(BIN)/gctl

# Start gctl on this machine's GPUs (fake ones without NVML), run the examples to completion.
demo: setup
	scripts/demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The whole check: linters, then every test on SQLite and PostgreSQL (GCTL_TEST_PG), four at a
# time (pytest-xdist): most tests wait on real processes, not on the CPU. A worker that runs out
# of tests takes some from another (worksteal), so the slow ones (10-18 s) do not end the run
# one after another on one worker.
test: lint
	$(BIN)/pytest -q -n 4 --dist worksteal

bench: setup
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .demo .pytest_cache .mypy_cache .ruff_cache .hypothesis
