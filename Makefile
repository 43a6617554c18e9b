# Duetime: `make run` starts the local stack with demo jobs; `make test` runs the test suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# `make run` needs only the runtime and moto's server (a fresh machine starts the stack sooner)
LOCAL_STAMP := $(VENV)/.installed-local
# byte-compile the project's own modules (under a second; only what changed): with PYTHONDONTWRITEBYTECODE set,
# as on some machines, every worker, API and Lambda process the stacks start would compile them from source
# (each module a process imports lazily, during a benchmark's burst too; `make bench` and `make faults` compile
# first, as `make run` and `make test` do)
COMPILE := $(PY) -m compileall -q -j 0 layers functions tests bench > /dev/null
# the installed packages byte-compiled on every core (pip compiles them on one: about 20 s more here); a file
# some package ships that does not compile is only left uncached
COMPILE_DEPS := $(PY) -m compileall -q -j 0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') > /dev/null 2>&1 || true
# import-linter's contracts (pyproject.toml); no cache directory left in the work tree
LINT_IMPORTS := $(VENV)/bin/lint-imports --no-cache --no-logo

.PHONY: fuzz run test test-unit test-integration test-e2e lint format typecheck clean synth lint-infra bench bench-quick faults

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e '.[local,dev,cdk]'
	$(COMPILE_DEPS)
	touch $(STAMP) $(LOCAL_STAMP)

$(LOCAL_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e '.[local]'
	$(COMPILE_DEPS)
	touch $(LOCAL_STAMP)

## the local stack with demo jobs (Ctrl-C stops it); ARGS="--tick-seconds 5" to pass options
run: $(LOCAL_STAMP)
	$(COMPILE)
	$(VENV)/bin/duetime local $(ARGS)

## the whole suite: unit, integration (moto in-process), end-to-end (the real local stack), and the fault
## harness with 400 seeds of the deterministic simulation on the SQLite adapters (in a quarter of the time 200 moto
## seeds took; `make faults` runs both variants at length, the moto one only there); first the import
## contracts (under a second). Four test processes on two cores: most end-to-end tests wait on real time
## (ticks, leases, tasks that sleep), so the extra processes keep the cores busy (1,677 tests in 7 min 36 s of
## pytest against 9 min 42 s with three, on 2026-12-04); `--dist loadgroup` keeps a group's tests on one process
test: $(STAMP)
	$(LINT_IMPORTS)
	$(COMPILE)
	$(VENV)/bin/pytest -n 4 --dist loadgroup -q

test-unit: $(STAMP)
	$(VENV)/bin/pytest -q tests/unit

test-integration: $(STAMP)
	$(VENV)/bin/pytest -q tests/integration

test-e2e: $(STAMP)
	$(VENV)/bin/pytest -q -m e2e tests/e2e

## ruff (lint and format) on everything, mypy strict on the core library and the handlers, and the import
## contracts of pyproject's [tool.importlinter] (layers, no SDK in domain/services, no cycles)
lint: $(STAMP)
	$(VENV)/bin/ruff check layers functions tests infra
	$(VENV)/bin/ruff format --check layers functions tests infra
	$(VENV)/bin/mypy layers/core/python/duetime functions
	$(LINT_IMPORTS)

format: $(STAMP)
	$(VENV)/bin/ruff format layers functions tests infra
	$(VENV)/bin/ruff check --fix layers functions tests infra

typecheck: $(STAMP)
	$(VENV)/bin/mypy layers/core/python/duetime functions

clean:
	rm -rf $(VENV) .duetime .pytest_cache .mypy_cache .ruff_cache

## --- the CDK app (infra/): synthesized offline, with no AWS credentials and no docker ----------------------
STAGE ?= dev
# jsii (aws-cdk-lib's runtime) prints a banner on Node versions it has not tested or no longer supports
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 18,20,21,22,23

## write cdk.out/Duetime-$(STAGE).template.json (STAGE=dev|prod|...); cdk-nag runs as part of it.
## BUNDLE=1 also builds the Lambda layer (pip downloads arm64 wheels: needs PyPI); the template is the same.
synth: $(STAMP)
	$(PY) -m infra.app -c stage=$(STAGE) $(if $(BUNDLE),,-c 'aws:cdk:bundling-stacks=[]')

## cdk-nag AwsSolutions (fails on any unacknowledged finding) and cfn-lint (W3005 = CDK's redundant DependsOn)
lint-infra: synth
	$(VENV)/bin/cfn-lint --ignore-checks W3005 -- cdk.out/Duetime-$(STAGE).template.json
	@echo "lint-infra: cdk-nag AwsSolutions and cfn-lint clean for stage $(STAGE)"

## schemathesis against the local stack's /openapi.json, with many more examples than the CI run
fuzz: $(STAMP)
	DUETIME_FUZZ_EXAMPLES=200 $(VENV)/bin/pytest -q tests/e2e/test_fuzz_api.py

## benchmarks (measurements, never pass/fail; ~20 min): cost per run, burst lag vs APScheduler 3, tick claims/s,
## scale model; prints a table and writes bench/results/latest.json. ARGS="lag --sizes 100" runs one part.
bench: $(STAMP)
	$(COMPILE)
	$(PY) -m bench $(or $(ARGS),all)

## the same parts on a small workload (under 3 minutes)
bench-quick: $(STAMP)
	$(COMPILE)
	$(PY) -m bench $(or $(ARGS),all) --quick

## fault injection at length (tests/faults/README.md): the process-level scenarios with their slow variants, and
## the deterministic simulation from SIM_BASE: SIM_SEEDS seeds on the SQLite adapters and SIM_AWS_SEEDS on
## the AWS adapters over moto (the moto variant runs only here), with the mutation tests of both; a failing
## seed prints how to replay it
SIM_SEEDS     ?= 5000
SIM_AWS_SEEDS ?= 5000
SIM_BASE      ?= 0
faults: $(STAMP)
	$(COMPILE)
	DUETIME_FAULTS_FULL=1 DUETIME_SIM_SEEDS=$(SIM_SEEDS) DUETIME_SIM_AWS_SEEDS=$(SIM_AWS_SEEDS) \
		DUETIME_SIM_BASE=$(SIM_BASE) $(VENV)/bin/pytest -n 2 -q -m faults tests/faults tests/sim
