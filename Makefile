# modeldrop: `make run-local` deploys a generated checkpoint end to end with no AWS account;
# `make test` is what CI runs (lint, types, template lint, tests).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= $(shell bash tools/find-python.sh)

.PHONY: install run-local test lint typecheck cfn-lint pytest bench asl schema sam-build clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

run-local: install
	$(VENV)/bin/modeldrop run-local

test: install lint typecheck cfn-lint pytest

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

cfn-lint: install
	$(VENV)/bin/cfn-lint template.yaml

pytest: install
	$(PY) -m pytest -q

# Validation throughput vs gzip -dc and peak RSS on generated 0.5/2/4 GB .tar.gz (cached in .bench/).
bench: install
	$(PY) tools/bench_validate.py $(SIZES)

asl: install
	$(PY) tools/gen_asl.py

schema: install
	$(PY) tools/gen_schema.py

# Needs the AWS SAM CLI (pip install aws-sam-cli) and python3.13 on PATH; no Docker required.
sam-build:
	sam build

clean:
	rm -rf $(VENV) .aws-sam .pytest_cache .mypy_cache .ruff_cache .bench
