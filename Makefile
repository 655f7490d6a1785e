# posttrain: `make demo` runs the tiny pipeline end to end on the embedded stack; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-stamp
S3RVER := infra/local/s3rver
S3RVER_STAMP := $(S3RVER)/node_modules/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install lint format test test-fast test-browser demo up down status bench gpu-check clean

install: $(STAMP) $(S3RVER_STAMP)

# torch first, pinned: the CPU build lies on disk; an open `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml requirements/constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c requirements/constraints.txt -e '.[airflow,dev]'
	$(PIP) check
	@touch $@

# The embedded S3 server (s3rver, file-backed) from the npm registry, exactly as the lockfile pins it.
$(S3RVER_STAMP): $(S3RVER)/package.json $(S3RVER)/package-lock.json
	npm ci --prefix $(S3RVER) --no-audit --no-fund --loglevel=error
	@touch $@

# The linter, the formatter's check and the type checker run first: a red lint fails `make test` like a failing
# test. `make format` rewrites the tree the way the check (and .pre-commit-config.yaml) wants it.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# pytest exits 5 when it collects nothing; make propagates every non-zero exit, so that fails too.
test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

# Only the browser tests (tests/browser): the UI through headless Chromium on the whole embedded stack.
test-browser: install
	$(PY) -m pytest -m browser $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# EXECUTOR=celery: Airflow's CeleryExecutor (PostgreSQL, Redis, one worker per queue); QUEUES=gpu,cpu picks them.
EXECUTOR ?=
QUEUES ?=
up: install
	$(PY) infra/local/stack.py up $(if $(EXECUTOR),--executor $(EXECUTOR)) $(if $(QUEUES),--queues $(QUEUES))

down:
	@if [ -x $(PY) ]; then $(PY) infra/local/stack.py down; else python3 infra/local/stack.py down; fi

status:
	$(PY) infra/local/stack.py status

demo: install
	$(PY) infra/local/demo.py

# benchmarks/qwen2.py at every size and length takes a long while on 2 cores: `make bench QWEN2_ARGS=--quick`
# runs only its 5M model.
# benchmarks/long_context.py at 16k tokens a row runs minutes per side: `LONG_ARGS="--lengths 2048"` for the short one.
QWEN2_ARGS ?=
LONG_ARGS ?= --record
bench: install
	@for b in benchmarks/taskset.py benchmarks/sandbox.py benchmarks/rl.py benchmarks/gate_power.py; do echo "== $$b"; $(PY) $$b || exit 1; done
	@echo "== benchmarks/qwen2.py $(QWEN2_ARGS)"; $(PY) benchmarks/qwen2.py $(QWEN2_ARGS)
	@echo "== benchmarks/long_context.py $(LONG_ARGS)"; $(PY) benchmarks/long_context.py $(LONG_ARGS)

gpu-check:
	bash infra/gpu-check.sh

clean: down
	rm -rf .local
