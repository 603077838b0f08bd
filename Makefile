# Two entry points: `make demo` (the main job) and `make test` (the suite). Each creates .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: demo test lint bench

$(VENV)/.installed: pyproject.toml setup.py
	python3 -m venv $(VENV)
	@# Without a GPU, pin the CPU build of torch so that no multi-GB CUDA wheel is pulled in.
	@if command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q "torch>=2.6"; \
	else $(PIP) install -q torch==2.13.0; fi
	$(PIP) install -q -e ".[dev,bench]"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/brickwork train

test: $(VENV)/.installed
	$(PY) -m pytest -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(VENV)/.installed
	$(PY) -m benchmarks
