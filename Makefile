# eagle3-operator developer commands. Everything installs itself on first use
# into ~/.cache/eagle3-operator (override with EAGLE3_CACHE), never into the repo.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTEST_ARGS ?=

.PHONY: help env testbed test e2e test-gpu test-families test-demo lint cluster demo crds dashboards

help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

env: ## create the cached Python environment (torch, vLLM CPU build, kopf, ...)
	@hack/python-env.sh >/dev/null

testbed: ## build the test bed's binaries: control plane, etcd, kwok, helm and the real node's (cached)
	@hack/build-testbed.sh >/dev/null && hack/build-node.sh >/dev/null

test: ## install what is missing (env, test bed, tiny target), then run the whole test suite
	@hack/system-deps.sh
	@bin=$$(hack/build-testbed.sh) && node=$$(hack/build-node.sh) && venv=$$(hack/python-env.sh) && \
	  EAGLE3_MONITORING_CRDS=$$(hack/build-monitoring-crds.sh) && export EAGLE3_MONITORING_CRDS && \
	  EAGLE3_PROMETHEUS_BIN=$$(hack/build-prometheus.sh) && export EAGLE3_PROMETHEUS_BIN && \
	  $$venv/bin/python -m eagle3_runtime.tiny_target >/dev/null && \
	  EAGLE3_TESTBED_BIN=$$bin EAGLE3_NODE_BIN=$$node PATH=$$venv/bin:$$bin:$$PATH \
	  $$venv/bin/python -m pytest $(PYTEST_ARGS)

e2e: ## the end-to-end tests alone: helm install, kubectl apply the tiny-cpu example, train and serve on the test bed's real node (about 30 min; prints progress)
	@hack/system-deps.sh
	@bin=$$(hack/build-testbed.sh) && node=$$(hack/build-node.sh) && venv=$$(hack/python-env.sh) && \
	  $$venv/bin/python -m eagle3_runtime.tiny_target >/dev/null && \
	  EAGLE3_TESTBED_BIN=$$bin EAGLE3_NODE_BIN=$$node PATH=$$venv/bin:$$bin:$$PATH \
	  $$venv/bin/python -m pytest tests/e2e -rA $(PYTEST_ARGS)

test-demo: ## `eagle3 pipeline --preset tiny-cpu` end to end with its acceptance bar (tests/demo; about 12 min, not in `make test`: tests/e2e holds the same bar)
	@venv=$$(hack/python-env.sh) && $$venv/bin/python -m eagle3_runtime.tiny_target >/dev/null && \
	  $$venv/bin/python -m pytest -o addopts="-ra --strict-markers" tests/demo $(PYTEST_ARGS)

test-families: ## re-measure a target family of docs/target-families.md (tests/families; 15-30 min per family, not in `make test`)
	@venv=$$(hack/python-env.sh) && $$venv/bin/python -m pytest -o addopts="-ra --strict-markers" tests/families $(PYTEST_ARGS)

test-gpu: ## the GPU tests (tests/gpu), in the current python3 with a CUDA PyTorch, on a GPU machine
	@python3 -m pytest -o addopts="-ra --strict-markers" --noconftest -p no:cacheprovider tests/gpu

lint: ## ruff check
	@venv=$$(hack/python-env.sh) && $$venv/bin/ruff check . && $$venv/bin/ruff format --check .

crds: ## regenerate crds/ and the chart's CRDs from the API models
	@venv=$$(hack/python-env.sh) && $$venv/bin/python -m eagle3_api.crdgen

dashboards: ## regenerate the chart's Grafana dashboards (files/dashboards/*.json) from hack/dashboards.py
	@venv=$$(hack/python-env.sh) && $$venv/bin/python hack/dashboards.py

cluster: ## start the local control plane with fake AMD GPU nodes and a real node; Ctrl-C stops it
	@hack/system-deps.sh
	@bin=$$(hack/build-testbed.sh) && node=$$(hack/build-node.sh) && venv=$$(hack/python-env.sh) && \
	  EAGLE3_TESTBED_BIN=$$bin EAGLE3_NODE_BIN=$$node PATH=$$venv/bin:$$bin:$$PATH \
	  $$venv/bin/python -m tests.support.cluster --real-node

demo: ## run the whole DraftTraining pipeline locally (tiny CPU preset)
	@venv=$$(hack/python-env.sh) && PATH=$$venv/bin:$$PATH $$venv/bin/eagle3 pipeline --preset tiny-cpu --workspace out/demo
