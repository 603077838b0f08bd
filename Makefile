# Entry points: `make demo` (the main job) and `make test` (the suite), both in .venv, installed from the
# pinned versions in constraints.txt. `make test-latest` is the canary: the newest releases, in .venv-latest.
# `make pins` updates constraints.txt: newest releases (torch held), the suite, then their versions.
# `make test-oldest` runs the suite on the lower bounds pyproject.toml declares, in .venv-oldest.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
PINS := constraints.txt

.PHONY: demo test test-latest test-oldest pins lint bench gpu structure

# A CUDA build of torch names the triton it was built with, so on a GPU machine the pinned triton (that
# of the CPU suite) is left to torch. torch==X also matches a local CPU build X+cpu where one is offered.
$(VENV)/.installed: pyproject.toml setup.py $(PINS)
	python3 -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1; then grep -v '^triton==' $(PINS) > $(VENV)/constraints.txt; \
	else cp $(PINS) $(VENV)/constraints.txt; fi
	$(PIP) install -q -c $(VENV)/constraints.txt torch
	$(PIP) install -q -c $(VENV)/constraints.txt -e ".[dev]"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/brickwork train

test: $(VENV)/.installed
	$(PY) -m pytest -q

# The newest release of every dependency that pyproject.toml allows, torch included (without a GPU a
# newest torch from the package index is a CUDA build of several GB: it runs on the CPU all the same).
test-latest:
	rm -rf .venv-latest
	python3 -m venv .venv-latest
	.venv-latest/bin/python -m pip install -q --upgrade pip
	.venv-latest/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e ".[dev]"
	.venv-latest/bin/brickwork --version
	.venv-latest/bin/brickwork info | sed -n '/^versions/,/^$$/p'
	.venv-latest/bin/python -m pytest -q

# Re-resolves every dependency to its newest release except torch, whose pinned line is kept (its build,
# CPU or CUDA, is the machine's business: move it by editing that line), runs the suite there and, only if
# it passes, writes the versions into constraints.txt.
pins:
	rm -rf .venv-pins
	python3 -m venv .venv-pins
	grep '^torch==' $(PINS) > .venv-pins/torch.txt
	.venv-pins/bin/python -m pip install -q -c .venv-pins/torch.txt -e ".[dev]"
	.venv-pins/bin/python -m pytest -q
	@echo "# The exact versions \`make test\` installs: the ones the suite last passed with." > $(PINS)
	@echo "# Written by \`make pins\`; torch moves by hand (edit its line, then run \`make pins\`)." >> $(PINS)
	.venv-pins/bin/python -m pip freeze --exclude-editable | sed -E 's/^(torch==[^+]*)\+.*/\1/' >> $(PINS)

test-oldest:
	rm -rf .venv-oldest
	python3 -m venv .venv-oldest
	python3 scripts/lower_bounds.py pyproject.toml > .venv-oldest/constraints.txt
	.venv-oldest/bin/python -m pip install -q -c .venv-oldest/constraints.txt -e ".[dev]"
	.venv-oldest/bin/brickwork info | sed -n '/^versions/,/^$$/p'
	.venv-oldest/bin/python -m pytest -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(VENV)/.installed
	$(PY) -m benchmarks

# On a CUDA machine whose Python already holds torch (brickwork installed with `pip install --no-deps
# -e .`): the gpu-marked tests, then the GPU benchmarks, their results written to benchmarks/results.
GPU_PY ?= python3
gpu:
	$(GPU_PY) -m pytest -m gpu -q -p no:cacheprovider
	$(GPU_PY) -m benchmarks.train_gpu
	$(GPU_PY) -m benchmarks.moe_experts --bias
	$(GPU_PY) -m benchmarks.moe_experts --no-bias
	$(GPU_PY) -m benchmarks.fused_linear_cross_entropy --chunk-size 1024 2048 8192 --vocab-multiple 64 --tokens 16384

# Structural figures read from the source: import cycles, private cross-folder imports, sizes.
structure:
	python3 scripts/structure.py
