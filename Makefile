# Two entry points for a fresh machine (see README): `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DB ?= $(CURDIR)/.demo/gctl.db

.PHONY: setup demo test lint bench clean

$(BIN)/gctl: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

setup: $(BIN)/gctl

# Apply the example manifests to a demo database and show what gctl now holds.
demo: setup
	@mkdir -p $(dir $(DEMO_DB))
	GCTL_DB=$(DEMO_DB) $(BIN)/gctl apply -f manifests/examples/
	GCTL_DB=$(DEMO_DB) $(BIN)/gctl get pools
	GCTL_DB=$(DEMO_DB) $(BIN)/gctl get jobs -o wide
	GCTL_DB=$(DEMO_DB) $(BIN)/gctl describe job hello

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The whole check: linters, then every test on SQLite and PostgreSQL (GCTL_TEST_PG).
test: lint
	$(BIN)/pytest -q

bench: setup
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .demo .pytest_cache .mypy_cache .ruff_cache .hypothesis
