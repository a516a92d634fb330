# lingjun-rdma — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
PY := $(VENV)/bin/python
STACK ?= dev
UV_VERSION := 0.13.9
APT_PACKAGES := python3-venv python3-pyverbs ibverbs-providers rdma-core iproute2
STAMP := $(VENV)/.synced
# pytest-xdist workers of `make test`: two per core, as many tests wait on a peer's answer or a
# timeout, and a worker that waits leaves its core to another
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) * 2 )))

.PHONY: help setup render test lint typecheck proto bench test-rdma e2e vm-node engine monitoring cold-build deploy \
  image sample-image clean

help: ## List every target
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: $(STAMP) ## apt packages, .venv from Debian's python3 (sees python3-pyverbs), locked deps
$(STAMP): pyproject.toml uv.lock
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null \
	  | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "apt: installing $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi
	@command -v uv >/dev/null || python3 -m pip install -q "uv==$(UV_VERSION)"
	@[ -x $(PY) ] || uv venv -q --python /usr/bin/python3 --system-site-packages $(VENV)
	uv sync -q --frozen
	@touch $@

render: setup ## Offline plan + every manifest of a stack: make render STACK=dev (no credentials)
	$(PY) -m infra.commands.render --stack $(STACK) --out out/$(STACK) $(RENDER_ARGS)

test: setup ## The test suite (unit + integration; rdma/e2e/engine/monitoring have their own targets)
	@$(PY) -m pytest -n $(TEST_WORKERS) -m "not rdma and not e2e and not engine and not monitoring and not vmnode" $(PYTEST_ARGS); rc=$$?; \
	  [ $$rc -ne 5 ] || echo "pytest ran no test: that is a failure here" >&2; exit $$rc

lint: setup ## ruff check + ruff format --check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup ## pyright strict on plugin/ and infra/ (generated stubs excluded)
	$(VENV)/bin/pyright

PROTOS := plugin/deviceplugin/api/v1beta1/api.proto plugin/dra/api/dra/v1/api.proto \
  plugin/dra/api/dra/v1beta1/api.proto plugin/dra/api/pluginregistration/v1/api.proto
proto: setup ## Regenerate the committed kubelet API stubs (device plugin, DRA, plugin registration)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m grpc_tools.protoc -I. --python_out=. \
	  --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. $(PROTOS)

bench: setup ## Benchmarks: print figures (never asserted); the DRA ones on the e2e cluster (root)
	# set before grpc loads: its C core logs every GOAWAY of the kubelet-restart figure otherwise
	GRPC_VERBOSITY=NONE $(PY) -m benchmarks.plugin_bench
	$(PY) -m benchmarks.infra_bench
	# the DRA figures need the e2e cluster's programs (built and cached as by `make e2e`) and root
	LINGJUN_E2E_BIN=$$(tests/e2e/peers.sh | tail -n1) GRPC_VERBOSITY=NONE $(PY) -m benchmarks.dra_bench

test-rdma: setup ## Real verbs in a Soft-RoCE qemu VM (image cached in ~/.cache/lingjun-rdma/vm); RDMA_VM_KERNEL=forky for a 7.x kernel
	tests/plugin/rdma/vm/run.sh

e2e: setup ## The plugin against a real kubelet v1.34 + containerd (builds and caches it)
	@tests/e2e/run.sh $(PYTEST_ARGS)

vm-node: setup ## A whole node in one TCG VM (kubelet, containerd, two rxe, the rendered plugin) joined to the e2e control plane
	@LINGJUN_E2E_BIN=$$(tests/e2e/peers.sh | tail -n1) LINGJUN_E2E_LOGS=$(CURDIR)/out/vm-node-logs \
	  $(PY) -m pytest -m vmnode tests/e2e/test_vm_node.py $(PYTEST_ARGS); rc=$$?; \
	  [ $$rc -ne 5 ] || echo "pytest ran no test: that is a failure here" >&2; exit $$rc

engine: setup ## The real Pulumi engine deploys the local stack onto the e2e cluster (builds and caches both)
	@tests/engine/run.sh $(PYTEST_ARGS)

monitoring: setup ## The alert pack and dashboard under the real promtool, against the Prometheus Operator's CRDs (builds and caches both)
	@tests/monitoring/run.sh $(PYTEST_ARGS)

cold-build: ## Every build (VM images, plugin image, Kubernetes programs, Pulumi engine) from empty caches
	tests/cold-build.sh

ACTION ?= up
deploy: setup ## The program through the Automation API with the `pulumi` CLI only: make deploy STACK=local ACTION=preview|up|refresh|destroy
	$(PY) -m infra.commands.deploy $(ACTION) --stack $(STACK)

IMAGE ?= lingjun-rdma-plugin:dev
image: ## Build plugin/Dockerfile as $(IMAGE): Docker/Podman if one runs, else buildah (IMAGE_ARCHIVE=tar to export)
	IMAGE=$(IMAGE) plugin/image.sh

SAMPLE ?= perftest
sample-image: ## Build a sample Job's image, infra/images/$(SAMPLE).Dockerfile, as $(IMAGE) (perftest; the CUDA ones: docs/samples.md)
	DOCKERFILE=infra/images/$(SAMPLE).Dockerfile IMAGE=$(IMAGE) plugin/image.sh

clean: ## Remove the venv and build outputs
	rm -rf $(VENV) out .pytest_cache .ruff_cache
