# pdwarden developer entry points. The README's two promises: `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CLUSTER_DIR := .cluster

.PHONY: help venv lint types imports unit test cluster-bin cluster-up cluster-down demo bench crd

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[worker,dev]'
	@touch $(STAMP)

venv: $(STAMP)  ## create .venv and install pdwarden with the worker and dev extras

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types: $(STAMP)  ## mypy (strict on the operator)
	$(BIN)/mypy -p pdwarden -p pdworker

imports: $(STAMP)  ## import-linter layer contracts
	$(BIN)/lint-imports

cluster-bin:  ## build (or reuse) the Go control-plane binaries in ~/.cache/pdwarden
	@e2e/cluster/build.sh >/dev/null

test: lint types imports cluster-bin  ## lint, types, import contracts and the whole pytest suite
	$(BIN)/python -m pytest

cluster-up: $(STAMP) cluster-bin  ## start the local control plane and kubelet; kubeconfig in .cluster/kubeconfig
	$(BIN)/python -m e2e.cluster up

cluster-down: $(STAMP)  ## stop the local control plane and every process it started
	$(BIN)/python -m e2e.cluster down

crd: $(STAMP)  ## regenerate crds/ from the pydantic models
	$(BIN)/pdwarden crd > crds/pddeployments.pdwarden.dev.yaml

demo: $(STAMP)  ## the main job: wedge a PD deployment on purpose and watch pdwarden repair it
	$(BIN)/pdwarden demo

bench: $(STAMP)  ## benchmarks; results in bench/results and bench/README.md
	@echo "make bench: the benchmarks are not built yet (issue: measure it and show it)." >&2; exit 2
