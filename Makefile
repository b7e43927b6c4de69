# pdwarden developer entry points. The README's two promises: `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CLUSTER_DIR := .cluster

.PHONY: help venv lint types imports test test-gpu cluster-bin lws-bin prometheus-bin vllm-venv sglang-venv cluster-up cluster-down demo bench \
	bench-gpu bench-fleet bench-repair crd manifests images

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

lws-bin: cluster-bin  ## build (or reuse) LeaderWorkerSet's controller (the LWS policy scenarios) in ~/.cache/pdwarden
	@e2e/cluster/build-lws.sh >/dev/null

prometheus-bin:  ## build (or reuse) Prometheus's promtool and server (the chart's alert tests) in ~/.cache/pdwarden
	@e2e/cluster/build-prometheus.sh >/dev/null

vllm-venv:  ## build (or reuse) stock vLLM for CPU + NIXL (the vLLM tier) in ~/.cache/pdwarden
	@e2e/vllm/build.sh >/dev/null

sglang-venv:  ## build (or reuse) stock SGLang for CPU + NIXL + its router (the SGLang tier) in ~/.cache/pdwarden
	@e2e/sglang/build.sh >/dev/null

test: lint types imports cluster-bin lws-bin prometheus-bin vllm-venv sglang-venv  ## lint, types, import contracts and the whole pytest suite
	$(BIN)/python -m pytest --durations=25  # the slowest tests in every CI log: where the time goes

cluster-up: $(STAMP) cluster-bin  ## start the local control plane and kubelet; kubeconfig in .cluster/kubeconfig
	$(BIN)/python -m e2e.cluster up

cluster-down: $(STAMP)  ## stop the local control plane and every process it started
	$(BIN)/python -m e2e.cluster down

crd: $(STAMP)  ## regenerate crds/ from the pydantic models
	$(BIN)/pdwarden crd --out-dir crds

manifests: $(STAMP) cluster-bin  ## render manifests/install.yaml from the Helm chart
	scripts/render-install.sh manifests/install.yaml

images:  ## build the operator and worker images (needs a Docker engine)
	@command -v docker >/dev/null && docker info >/dev/null 2>&1 || \
		{ echo "make images: no Docker engine here; see images/README.md" >&2; exit 2; }
	docker build -f images/operator.Dockerfile -t ghcr.io/pdwarden/pdwarden:0.1.0 .
	docker build -f images/worker-cpu.Dockerfile -t ghcr.io/pdwarden/pdworker:0.1.0-cpu .
	docker build -f images/worker-cuda.Dockerfile -t ghcr.io/pdwarden/pdworker:0.1.0-cuda12 .

ENGINE ?= pdworker
demo: $(STAMP) cluster-bin $(if $(filter vllm,$(ENGINE)),vllm-venv) $(if $(filter sglang,$(ENGINE)),sglang-venv)  ## the main job: wedge a PD deployment on purpose and watch pdwarden repair it (ENGINE=vllm or sglang: real engine pods)
	$(BIN)/python -m e2e.demo --engine $(ENGINE)

bench: $(STAMP) cluster-bin  ## benchmarks; results in bench/results and bench/README.md
	$(BIN)/python -m bench

# QUICK=1: 10 PDDeployments (and 10 LeaderWorkerSets) of 25 pods, < 10 min on 2 cores. Full: 10, 50
# and 200 of them (5000 pods each side), 40-80 min. py-spy (PyPI) profiles the operator.
bench-fleet: $(STAMP) cluster-bin lws-bin prometheus-bin  ## the operator at fleet scale on kwok beside LWS, then in prometheus mode beside a real Prometheus; bench/results/fleet[-quick].json
	@test -x $(BIN)/py-spy || $(BIN)/python -m pip install --quiet py-spy
	$(BIN)/python -m bench.fleet $(if $(QUICK),--quick)

# ~15 min: the real vLLM pair's fault scenarios at default settings, their figures as data.
bench-repair: $(STAMP) cluster-bin vllm-venv sglang-venv  ## time to repair per scenario on the real vLLM and SGLang pairs, beside the engine alone; bench/results/repair.json
	$(BIN)/python -m bench.repair

PYRUN ?= $(BIN)/python

test-gpu:  ## the worker suite on CUDA (gpu-marked tests too); PYRUN=python3 on a bare GPU machine
	@$(PYRUN) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu: no CUDA device here (GPU tests would only skip)')"
	$(PYRUN) -m pytest tests/worker --confcutdir tests/worker -p no:cacheprovider -q -x

bench-gpu:  ## GPU KV transfer benchmark, VRAM to VRAM (< 8 min); bench/results/kv_transfer-gpu.json
	$(PYRUN) -m bench.kv_transfer --device cuda
