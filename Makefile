# The commands people type. Every target creates what it needs first: system programs (Debian packages, when
# missing), the virtual environment, the Pulumi engine.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
KVM_STAMP := $(VENV)/.installed-kvm
export PATH := $(CURDIR)/.tools/bin:$(CURDIR)/$(VENV)/bin:$(PATH)
export PULUMI_SKIP_UPDATE_CHECK := true

.DEFAULT_GOAL := help
.PHONY: help install system-deps test-deps kvm-deps bench-deps venv kvm-python kvm-image tools kube-tools kube-api-tools kube-node-tools run test lint bench clean kvm-ssh-secret lock image faults

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

install: system-deps venv tools ## system programs, virtual environment, Pulumi CLI and language host

system-deps: ## Python 3.11 with venv, from Debian's packages when missing (apt-get as root, else says what)
	@PYTHON=$(PYTHON) bash scripts/install-system-deps.sh base

test-deps: ## what the tests start or call: redis-server, pgrep, ssh-keygen, openssl (as system-deps)
	@PYTHON=$(PYTHON) bash scripts/install-system-deps.sh test

kvm-deps: ## the test KVM host and make kvm-image: libvirt, QEMU, dnsmasq, sshd, mmdebstrap, extlinux (part of test-deps)
	@PYTHON=$(PYTHON) bash scripts/install-system-deps.sh kvm

bench-deps: ## the daemons the benchmarks compare with: tinyproxy, dante-server (started by no postinst)
	@PYTHON=$(PYTHON) bash scripts/install-system-deps.sh bench

venv: $(STAMP) ## the virtual environment, from requirements.lock (with the client package, clients/python)

$(STAMP): pyproject.toml requirements.lock clients/python/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c requirements.lock -e '.[test]' -e 'clients/python[scrapy]'  # + the client package
	@touch $@

kvm-python: $(KVM_STAMP) ## libvirt-python, the [kvm] extra (an sdist: built against libvirt-dev from kvm-deps)

$(KVM_STAMP): $(STAMP) | kvm-deps
	$(PY) -m pip install -q -c requirements.lock -e '.[test,kvm]'
	@touch $@

tools: ## Pulumi CLI + Python language host (official bundle, else built with Go); idempotent
	@bash scripts/install-tools.sh

kube-tools: kube-api-tools kube-node-tools ## etcd, kube-apiserver, the provider plugin and the test node's programs and images (built once, cached outside the clone)

kube-api-tools: ## etcd, kube-apiserver and the Kubernetes provider plugin (what tests/kube's API-server tests need)
	@bash scripts/install-kube.sh
	@bash scripts/install-k8s-plugin.sh

kube-node-tools: ## the test node's programs (kubelet, ..., CoreDNS) and its images
	@bash scripts/install-kube-node.sh
	@$(PYTHON) -m tests.kube.images

run: install ## provision the sample local proxies with the real engine and serve the discovery API
	$(VENV)/bin/proxy-operator serve --manifests examples/local

test: install test-deps kvm-python ## run the test suite (unit tests and real-engine tests), with make kube-tools beside it
	@PY=$(PY) bash scripts/test.sh

FAULT_SEEDS ?= 1 2 3
faults: install test-deps kube-tools ## a longer seeded fault campaign (tests/faults/README.md); FAULT_SEEDS="1 2 3"
	$(PY) -m tests.faults.campaign $(foreach s,$(FAULT_SEEDS),--seed $(s)) --sequences 3 --faults-per-sequence 4 --replicas 3

lint: venv ## ruff, formatting, the layer contracts and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

bench: install bench-deps ## benchmarks: figures and ratios against baselines measured in the same run
	@for b in tests/bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

image: tools ## container image from the Dockerfile with podman, no registry (root; the node tests build it too: tests/kube/operator_image.py)
	@bash scripts/install-k8s-plugin.sh
	@bash scripts/build-image.sh

KVM_IMAGE ?= full
kvm-image: kvm-deps ## the kvm guest image from Debian's packages, cached outside the clone (KVM_IMAGE=fast: the tests' fast-boot one)
	@bash scripts/build-kvm-image.sh $(KVM_IMAGE)

kvm-ssh-secret: ## print/apply the kvm-ssh Secret (KVM_SSH_KEY, KVM_KNOWN_HOSTS); refuses a .pub key
	@bash scripts/kvm-ssh-secret.sh

lock: ## re-resolve requirements.lock from pyproject.toml (then review the diff)
	$(PY) -m pip freeze --exclude-editable | grep -v '^proxy-operator' > requirements.lock

clean: ## stop the local proxies `make run` started, remove the venv, the engine and local state
	@pkill -f "$(CURDIR)/[.]state/" || true  # [.]: never match this shell's own command line
	rm -rf $(VENV) .tools .state .pytest_cache .ruff_cache .mypy_cache *.egg-info
