# Duetime: `make run` starts the local stack with demo jobs; `make test` runs the test suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-unit test-integration test-e2e lint format typecheck clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[local,dev]'
	touch $(STAMP)

## the local stack with demo jobs (Ctrl-C stops it); ARGS="--tick-seconds 5" to pass options
run: $(STAMP)
	$(VENV)/bin/duetime local $(ARGS)

## the whole suite: unit, integration (moto in-process) and end-to-end (the real local stack)
test: $(STAMP)
	$(VENV)/bin/pytest -n 2 -q

test-unit: $(STAMP)
	$(VENV)/bin/pytest -q tests/unit

test-integration: $(STAMP)
	$(VENV)/bin/pytest -q tests/integration

test-e2e: $(STAMP)
	$(VENV)/bin/pytest -q -m e2e tests/e2e

lint: $(STAMP)
	$(VENV)/bin/ruff check layers functions tests infra
	$(VENV)/bin/ruff format --check layers functions tests infra

format: $(STAMP)
	$(VENV)/bin/ruff format layers functions tests infra
	$(VENV)/bin/ruff check --fix layers functions tests infra

typecheck: $(STAMP)
	$(VENV)/bin/mypy layers/core/python/duetime

clean:
	rm -rf $(VENV) .duetime .pytest_cache .mypy_cache .ruff_cache
