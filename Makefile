# kubetf: `make demo` runs a real distributed training job; `make test` runs every test tier.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST := $(PY) -m pytest
KUBETF := $(VENV)/bin/kubetf
VERSION := 0.1.0
CRD := operator/kubetf/crd/trainingjobs.kubetf.io.yaml
CLUSTER := tests/cluster/local-cluster.sh
BASE_IMAGE := kubetf/python-base:bookworm
OPERATOR_IMAGE := kubetf/operator:$(VERSION)
TRAINER_IMAGE := kubetf/trainer:$(VERSION)
OPERATOR_NAMESPACE := kubetf-system
DEMO_NAMESPACE := kubetf-demo
export PATH := $(HOME)/.cache/kubetf/bin:$(PATH)
# Python keeps its compiled modules (.venv, __pycache__): the tiers start hundreds of Python processes that import
# TensorFlow, kopf and the Kubernetes client, and where the environment sets PYTHONDONTWRITEBYTECODE (some shells
# and CI images do) each of them compiled those anew: a TensorFlow import took 17 CPU-s instead of 7.
unexport PYTHONDONTWRITEBYTECODE

# The cluster: $KUBECONFIG or ~/.kube/config when there is one, else the local cluster (tests/cluster).
LOCAL_KUBECONFIG := $(or $(KUBETF_CLUSTER_DIR),/var/lib/kubetf-cluster)/admin.kubeconfig
TARGET_KUBECONFIG := $(or $(KUBECONFIG),$(wildcard $(HOME)/.kube/config),$(LOCAL_KUBECONFIG))
IS_LOCAL := $(if $(filter $(LOCAL_KUBECONFIG),$(TARGET_KUBECONFIG)),yes,)
KUBECTL := kubectl --kubeconfig $(TARGET_KUBECONFIG)
HELM := helm --kubeconfig $(TARGET_KUBECONFIG)

.PHONY: help venv tools lint manifests test test-quick test-unit test-trainer test-integration test-e2e test-cluster test-trainer-beside-alone test-load \
	test-unit-beside-lint-kueue test-k8s-1.35 test-k8s-1.36 test-cluster-staged \
	cluster cluster-down images install \
	demo demo-kueue bench bench-scale bench-compare bench-call-cost bench-kueue bench-kueue-scale bench-progress bench-resume bench-churn
help:
	@grep -E '^[a-z0-9.-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# uv installs from its cache (~/.cache/kubetf/uv) in seconds where pip took over a minute (TensorFlow's wheels).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv
	UV_CACHE_DIR=$(HOME)/.cache/kubetf/uv $(VENV)/bin/uv pip install -q --python $(PY) -e '.[dev,trainer]'
	touch $@

venv: $(VENV)/.installed ## .venv with the project, the dev tools and TensorFlow

tools: ## kubectl, helm, Debian's prometheus and promtool under ~/.cache/kubetf/bin; Debian's Chromium (the e2e tier's headless browser)
	$(CLUSTER) tools
	tests/monitoring/install-prometheus.sh
	@command -v chromium >/dev/null || { echo "apt-get install chromium"; apt-get -o DPkg::Lock::Timeout=600 update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium >/dev/null; }

lint: venv ## ruff, mypy and the import contracts (pure modules do no I/O)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

manifests: ## copy the CRD (the single source) to manifests/ and the chart; re-render the kubectl install path
	cp $(CRD) manifests/crd/
	cp $(CRD) helm/kubetf/crds/
	helm/render-manifests.sh

# The cluster tiers run on xdist workers (tests wait on the API server and on pods far more than they compute): each
# worker has its own operator, Lease and namespaces (tests/integration/conftest.py); tests marked `serial` (they
# restart the API server, replace or uninstall the installed operator) run afterwards, alone on the cluster. Each
# stage writes JUnit XML to $(RESULTS); `make test` ends with tests/summary.py's table.
# WORKERS: the integration tier's; E2E_WORKERS: the e2e tier's (its tests mostly wait on pods, Kueue and timeouts:
# on 4 the cores were a third idle; the local node advertises GPUs for six Kueue tests at once); TRAINER_WORKERS:
# TensorFlow jobs run at once.
WORKERS ?= 3
E2E_WORKERS ?= 5
TRAINER_WORKERS ?= 2
RESULTS ?= .test-results
# One work unit (a test, or an xdist_group's tests) at a time to each worker, in the collection's order, which
# tests/ordering.py makes longest first. (xdist's default sends chunks of consecutive tests: the longest chunk to one
# worker, which then ran alone at the end; and it puts the biggest xdist_group first.)
xdist = -n $(1) --dist loadgroup --no-loadscope-reorder
XDIST = $(call xdist,$(WORKERS))
junit = --junitxml=$(RESULTS)/$(1).xml
# The cluster tiers' runs, each written once: `make test`, test-quick, test-integration, test-e2e and test-k8s-1.35
# all run these.
integration_parallel = $(PYTEST) $(XDIST) -m "integration and not serial and not load" tests/integration \
	$(call junit,integration)
integration_alone = $(PYTEST) -m "integration and serial and not load" tests/integration $(call junit,integration-alone)
e2e_parallel = KUBETF_IMAGES_BUILT=1 $(PYTEST) $(call xdist,$(E2E_WORKERS)) -m "e2e and not serial" tests/e2e \
	$(call junit,e2e)
e2e_alone = KUBETF_IMAGES_BUILT=1 $(PYTEST) -m "e2e and serial" tests/e2e $(call junit,e2e-alone)

test-unit: venv tools ## pure tests, seconds (one xdist worker per core: they compute)
	$(PYTEST) $(call xdist,auto) -m unit tests/unit $(call junit,unit)

test-trainer: venv ## TensorFlow training as local processes (kubetf local), two jobs at once
	$(PYTEST) $(call xdist,$(TRAINER_WORKERS)) -m trainer tests/trainer $(call junit,trainer)

test-integration: venv tools ## the operator against the real API server: in parallel, then the tests that run alone
	$(integration_parallel)
	$(integration_alone)

test-e2e: venv tools ## the chart and real TensorFlow pods: in parallel, then the tests that run alone
	$(MAKE) --no-print-directory images
	$(e2e_parallel)
	$(e2e_alone)

test-load: venv tools ## the issue-size load tests, alone on the cluster (a tenant's attacks while 2,000 jobs report: ~15 min)
	$(PYTEST) -m load -s tests/integration $(call junit,load)

test-cluster: test-integration test-e2e ## integration and e2e tiers on $$KUBECONFIG, else on the local cluster

# One stage: run it, record its wall time and how busy the machine's CPUs were (whether more parallel workers can
# help: /proc/stat, Linux) for the summary, stop at the first failure.
cpu_jiffies = awk '/^cpu /{t=0; for (i=2; i<=NF; i++) t+=$$i; print t, $$5+$$6}' /proc/stat 2>/dev/null || true
stage = start=$$SECONDS; cpu=$$($(cpu_jiffies)); $(2) || exit $$?; took=$$((SECONDS - start)); \
	busy=$$(echo "$$cpu $$($(cpu_jiffies))" | awk 'NF==4 && $$3>$$1 {printf "%d%%", 100*(($$3-$$1)-($$4-$$2))/($$3-$$1)}'); \
	printf '%s\t%s\t%s\n' "$(1)" "$$took" "$$busy" >> $(RESULTS)/stages.tsv; \
	echo "::: $(1) took $${took}s$${busy:+ (CPU busy $$busy)}"

test: venv tools ## every test tier, each stage timed, then one table (tiers, stages, slowest tests)
	@rm -rf $(RESULTS) && mkdir -p $(RESULTS)
	@$(call stage,unit (lint + Kueue + Volcano + MultiKueue's planes + images beside),$(MAKE) --no-print-directory \
		test-unit-beside-lint-kueue BESIDE_UNIT=images MULTIKUEUE=multikueue)
	@$(call stage,integration (parallel),$(integration_parallel))
	@$(call stage,e2e (parallel),$(e2e_parallel))
	@$(call stage,trainer beside the cluster tests that run alone,$(MAKE) --no-print-directory test-trainer-beside-alone)
	@$(PY) -m tests.summary $(RESULTS)

# Lint and the Kueue and Volcano installs (the integration tier's first Kueue test waited ~35 s for Kueue; the e2e
# gang tests need Volcano) run beside the unit tier, which leaves a third of the cores idle, and with
# BESIDE_UNIT=images (`make test`) the images are built too (a stage of its own, 32 s at 60% of the cores); their
# output goes to files, shown when all are done. With MULTIKUEUE=multikueue (`make test`), MultiKueue's two more
# control planes come up after Kueue and stay until the MultiKueue tests (run alone, last) stop them: brought up by
# those tests' fixture in the last stage, beside the other tests' load, their Kueues took 70 s instead of 14 to
# serve; beside the integration tier, their start held an operator's reconciles up for 8 s (a 4-s deadline fired
# before its job was seen Running). Nothing beside the unit tier depends on time. Ctrl-C stops all.
BESIDE_UNIT ?=
MULTIKUEUE ?=
test-unit-beside-lint-kueue: venv tools
	@set +e; $(MAKE) --no-print-directory lint > $(RESULTS)/lint.log 2>&1 & lint=$$!; \
	{ $(MAKE) --no-print-directory kueue volcano && { [ -z "$(MULTIKUEUE)" ] || [ -z "$(IS_LOCAL)" ] || \
		$(CLUSTER) $(MULTIKUEUE); }; } > $(RESULTS)/kueue.log 2>&1 & kueue=$$!; \
	$(MAKE) --no-print-directory $(or $(BESIDE_UNIT),venv) > $(RESULTS)/beside.log 2>&1 & beside=$$!; \
	trap 'kill -INT $$lint $$kueue $$beside 2>/dev/null; wait; exit 130' INT TERM; \
	$(MAKE) --no-print-directory test-unit; unit=$$?; \
	wait $$lint; linted=$$?; echo "::: lint, run beside:"; cat $(RESULTS)/lint.log; \
	wait $$kueue; installed=$$?; echo "::: Kueue, Volcano$(if $(MULTIKUEUE), and MultiKueue's planes), installed beside:"; \
		tail -n 20 $(RESULTS)/kueue.log; \
	wait $$beside; built=$$?; [ -z "$(BESIDE_UNIT)" ] || { echo "::: $(BESIDE_UNIT), beside:"; \
		tail -n 5 $(RESULTS)/beside.log; }; \
	[ $$unit = 0 ] && [ $$linted = 0 ] && [ $$installed = 0 ] && [ $$built = 0 ]

# The trainer tier needs no cluster, so it runs beside the cluster tests that must run alone (they mostly wait, it
# computes, two TensorFlow jobs at a time: with one, the two left a third of the cores idle): first the e2e ones (they
# replace or uninstall the installed operator), last the API server restart (the cluster's components settle for a
# while after it). The trainer runs niced: the cluster tests' bursts (the operator, the API server, Kueue) get the
# cores first, the trainer what they leave (not niced, its TensorFlow made the 200 queued jobs' test 2.5-5x slower
# than alone). Its output goes to a file, shown when both are done; Ctrl-C stops both.
test-trainer-beside-alone: venv tools
	@set +e; nice -n 10 $(PYTEST) $(call xdist,$(TRAINER_WORKERS)) -m trainer tests/trainer $(call junit,trainer) \
		> $(RESULTS)/trainer.log 2>&1 & trainer=$$!; \
	trap 'kill -INT $$trainer 2>/dev/null; wait $$trainer; exit 130' INT TERM; \
	$(e2e_alone); alone=$$?; \
	$(integration_alone) || alone=1; \
	wait $$trainer; trained=$$?; echo "::: the trainer tier, run beside them:"; cat $(RESULTS)/trainer.log; \
	[ $$alone = 0 ] && [ $$trained = 0 ]

test-quick: venv tools ## the edit-test loop: lint, unit and the integration tests that run in parallel (minutes)
	@rm -rf $(RESULTS) && mkdir -p $(RESULTS)
	@$(call stage,unit (lint + Kueue + Volcano beside),$(MAKE) --no-print-directory test-unit-beside-lint-kueue)
	@$(call stage,integration (parallel),$(integration_parallel))
	@$(PY) -m tests.summary $(RESULTS)

# Kubernetes 1.35 (users run 1.35 to 1.37; CI runs 1.37): the integration and e2e tiers against the local cluster
# brought up at 1.35 (control plane, kubelet and kube-proxy; the Workload API off, as 1.35 ships it), then the cluster
# put back as it was (tests/cluster/with-k8s.sh says how). Meanwhile nobody else has the local cluster: an `up` from
# elsewhere waits for the end. K8S_1_35: the newest 1.35 patch the Go module proxy serves (it refuses v1.35.7 and
# everything after v1.35.8). Tests marked k8s_min("1.37", reason=...) are skipped with their reason
# (tests/cluster/k8s_version.py); nothing else is left out.
# The recipe names make through `submake`, not $(MAKE): make runs a line naming $(MAKE) even under `make -n`, and
# this one takes the cluster down.
K8S_1_35 ?= v1.35.8
submake = $(MAKE)
test-k8s-1.35: venv tools ## integration and e2e tiers on the local cluster at Kubernetes 1.35, then it is put back (~30 min)
	tests/cluster/with-k8s.sh $(K8S_1_35) -- $(submake) --no-print-directory test-cluster-staged

# Kubernetes 1.36, as 1.35 above: the newest 1.36 patch the Go module proxy serves (v1.36.1 and v1.36.3, November
# 2026); the Workload API off (alpha in 1.36, as 1.36 ships it), container restart rules on (beta since 1.35).
K8S_1_36 ?= v1.36.3
test-k8s-1.36: venv tools ## integration and e2e tiers on the local cluster at Kubernetes 1.36, then it is put back (~30 min)
	tests/cluster/with-k8s.sh $(K8S_1_36) -- $(submake) --no-print-directory test-cluster-staged

# The cluster tiers' stages as `make test` runs them (no unit, no trainer), each timed; every stage runs even after
# one failed (a compatibility run reports everything), then the summary table; fails if any stage failed.
keep_going = $(2) || { echo "$(1)" >> $(RESULTS)/failed-stages; echo "::: $(1) FAILED"; }
test-cluster-staged: venv tools
	@rm -rf $(RESULTS) && mkdir -p $(RESULTS)
	@$(call stage,integration (parallel),$(call keep_going,integration (parallel),$(integration_parallel)))
	@$(call stage,images,$(call keep_going,images,$(MAKE) --no-print-directory images))
	@$(call stage,e2e (parallel),$(call keep_going,e2e (parallel),$(e2e_parallel)))
	@$(call stage,e2e (alone),$(call keep_going,e2e (alone),$(e2e_alone)))
	@$(call stage,integration (alone),$(call keep_going,integration (alone),$(integration_alone)))
	@$(PY) -m tests.summary $(RESULTS); summary=$$?; \
	if [ -s $(RESULTS)/failed-stages ]; then echo "::: failed stages: $$(paste -sd, $(RESULTS)/failed-stages)"; exit 1; fi; \
	exit $$summary

cluster: ## the local cluster, unless a kubeconfig names another one (FAKE_NODES=4: also 4 fake kwok nodes)
	@if [ -n "$(IS_LOCAL)" ]; then $(CLUSTER) up $(if $(FAKE_NODES),--fake-nodes $(FAKE_NODES)); \
	else echo "using the cluster of $(TARGET_KUBECONFIG)"; fi

cluster-down: ## stop the local cluster and clean up after it
	$(CLUSTER) down

.PHONY: kueue
kueue: cluster ## Kueue in kueue-system, idempotent (local cluster: built here once, ~5 min; kind: kind.sh kueue)
	@if [ -n "$(IS_LOCAL)" ]; then $(CLUSTER) kueue; \
	else echo "not the local cluster: install Kueue on $(TARGET_KUBECONFIG) yourself (kind: tests/cluster/kind.sh kueue)"; fi

.PHONY: volcano
volcano: cluster ## Volcano's scheduler in volcano-system, idempotent (local cluster: built here once, ~4 min)
	@if [ -n "$(IS_LOCAL)" ]; then $(CLUSTER) volcano; \
	else echo "not the local cluster: install Volcano on $(TARGET_KUBECONFIG) yourself (its scheduler named volcano)"; fi

images: ## build the operator and trainer images FROM the local base; load them into the local cluster
	$(CLUSTER) images
	DOCKER_BUILDKIT=0 docker build --network host -q -f operator/Dockerfile \
		--build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(OPERATOR_IMAGE) .
	DOCKER_BUILDKIT=0 docker build --network host -q -f trainer_image/Dockerfile \
		--build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(TRAINER_IMAGE) trainer_image
	@if [ -n "$(IS_LOCAL)" ]; then $(CLUSTER) load $(OPERATOR_IMAGE) $(TRAINER_IMAGE); \
	else echo "push or load $(OPERATOR_IMAGE) and $(TRAINER_IMAGE) into your cluster (kind: tests/cluster/kind.sh)"; fi

install: venv tools ## the CRD, then the chart into kubetf-system (restricted Pod Security Standard)
	$(KUBECTL) apply --server-side --force-conflicts -f manifests/crd/
	$(KUBECTL) create namespace $(OPERATOR_NAMESPACE) --dry-run=client -o yaml | $(KUBECTL) apply -f -
	$(KUBECTL) label --overwrite namespace $(OPERATOR_NAMESPACE) pod-security.kubernetes.io/enforce=restricted
	$(HELM) upgrade --install kubetf helm/kubetf --namespace $(OPERATOR_NAMESPACE) --wait --timeout 5m

demo: venv cluster images install ## a real 2-worker MNIST job on the cluster, followed to the end
	$(KUBECTL) create namespace $(DEMO_NAMESPACE) --dry-run=client -o yaml | $(KUBECTL) apply -f -
	$(KUBECTL) -n $(DEMO_NAMESPACE) delete trainingjob mnist-mwms --ignore-not-found --wait
	$(KUBECTL) -n $(DEMO_NAMESPACE) delete pvc mnist-mwms-checkpoint --ignore-not-found --wait
	$(KUBETF) submit -f manifests/samples/mnist-mwms.yaml -n $(DEMO_NAMESPACE) --kubeconfig $(TARGET_KUBECONFIG)
	$(KUBETF) status mnist-mwms -n $(DEMO_NAMESPACE) --kubeconfig $(TARGET_KUBECONFIG)

demo-kueue: venv cluster images install kueue ## two MNIST jobs competing for a ClusterQueue's 2 GPUs under Kueue
	$(KUBECTL) create namespace $(DEMO_NAMESPACE) --dry-run=client -o yaml | $(KUBECTL) apply -f -
	$(KUBECTL) -n $(DEMO_NAMESPACE) apply -f manifests/samples/kueue/queues.yaml
	$(KUBECTL) -n $(DEMO_NAMESPACE) delete trainingjob mnist-a mnist-b --ignore-not-found --wait
	$(KUBECTL) -n $(DEMO_NAMESPACE) delete pvc mnist-a-checkpoint mnist-b-checkpoint --ignore-not-found --wait
	$(KUBETF) submit -d -f manifests/samples/kueue/mnist-a.yaml -n $(DEMO_NAMESPACE) --kubeconfig $(TARGET_KUBECONFIG)
	@echo "mnist-b wants the same 2 GPUs: Kueue keeps it Queued (no pod runs) until mnist-a is done"
	$(KUBETF) submit -f manifests/samples/kueue/mnist-b.yaml -n $(DEMO_NAMESPACE) --kubeconfig $(TARGET_KUBECONFIG)
	$(KUBECTL) -n $(DEMO_NAMESPACE) get trainingjobs mnist-a mnist-b
	$(KUBECTL) -n $(DEMO_NAMESPACE) get workloads

bench: venv ## operator benchmark (creation latency, burst, preemption recovery, memory)
	$(PY) -m tests.bench.operator_bench

bench-scale: venv ## scale benchmark on kwok's fake nodes (default 2,000 jobs; ARGS="--jobs 100 --burst 20")
	$(PY) -m tests.bench.scale $(ARGS)

bench-kueue: venv tools ## with and without Kueue: apply -> pods Running, and Kueue's preemption (real pods)
	$(PY) -m tests.bench.kueue_bench $(ARGS)

bench-kueue-scale: venv tools ## Kueue on kwok: 5,000 queued jobs' API cost, 1,000 admitted, a 100-job priority chain
	$(PY) -m tests.bench.kueue_scale $(ARGS)

bench-churn: venv ## connection churn against the operator's HTTP server with its heap frozen: RSS, garbage, CPU (no cluster)
	$(PY) -m tests.bench.connection_churn $(ARGS)

bench-progress: venv tools ## progress reports on kwok: 2,000 jobs reporting every second vs quiet (ARGS="--jobs 200")
	$(PY) -m tests.bench.progress_scale $(ARGS)

bench-compare: venv tools ## kubetf vs Kubeflow's training-operator vs the raw API server (ARGS="--foreign-pods 5000")
	$(PY) -m tests.bench.compare $(ARGS)

bench-call-cost: venv ## the API server's CPU per call a new job makes, and the burst ratio it allows
	$(PY) -m tests.bench.call_cost $(ARGS)

# The trainer image first: the bench's pods must run this checkout's trainer (its phase lines, --fail-after-epoch).
bench-resume: venv tools images ## real TensorFlow: cause of a restart -> first step, by phase; in place, recreated, by hand, Kubeflow
	$(PY) -m tests.bench.resume $(ARGS)
