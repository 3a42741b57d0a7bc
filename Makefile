# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
# Both install libtorch (the torch==2.11.0 wheel from PyPI) into .venv first when it is missing,
# with CUDA's crt and CCCL headers, which the NCCL shim for multi-GPU drafters compiles against.

PYTHON ?= python3
VENV := .venv
TORCH_VERSION := 2.11.0
LIBTORCH_LINK := $(VENV)/libtorch
CARGO ?= cargo

REF_DEPS := $(VENV)/.reference-deps
RUFF_VERSION := 0.17.5
MYPY_VERSION := 2.4.1
# The stamp names the versions: a new pin installs again.
LINT_DEPS := $(VENV)/.lint-deps-ruff-$(RUFF_VERSION)-mypy-$(MYPY_VERSION)
REFERENCE := target/reference/reference.safetensors
PARITY := target/reference/parity/parity.json
STEP := target/reference/parity/step/step.json

.PHONY: run test lint venv reference tools build release bench gpu-tests clean-venv

run: venv
	$(CARGO) run --release --

test: venv lint reference tools
	$(VENV)/bin/python -m pytest -q python/tests
	$(CARGO) test --all-targets

# The Python client's lint and types, before any test (settings in python/pyproject.toml;
# python/peer is not linted here).
lint: $(LINT_DEPS)
	$(VENV)/bin/ruff check python/dflash_top python/tests
	$(VENV)/bin/mypy --config-file python/pyproject.toml python/dflash_top

$(LINT_DEPS): $(LIBTORCH_LINK)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check ruff==$(RUFF_VERSION) \
		mypy==$(MYPY_VERSION)
	touch $@

# The end-to-end test drives the real binary in tmux.
tools:
	@command -v tmux >/dev/null || (apt-get update -qq && apt-get install -y -qq tmux)

# Reference numbers from PyTorch + transformers + z-lab's dflash and SpecForge 0.2.0 (both without
# their extras: their DFlash modules need only torch and transformers).
reference: $(REFERENCE) $(PARITY) $(STEP)

$(REF_DEPS): $(LIBTORCH_LINK)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check transformers==5.15.0 numpy \
		pydantic pytest matplotlib
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps dflash==0.1.0 \
		specforge==0.2.0
	touch $@

$(REFERENCE): tests/reference/make_reference.py tests/reference/lm_target.py \
		tests/reference/llama_reference.py $(REF_DEPS)
	$(VENV)/bin/python tests/reference/make_reference.py target/reference

$(PARITY): tests/reference/specforge_parity.py $(REF_DEPS)
	$(VENV)/bin/python tests/reference/specforge_parity.py target/reference/parity

$(STEP): tests/reference/specforge_step.py $(REF_DEPS)
	$(VENV)/bin/python tests/reference/specforge_step.py target/reference/parity/step

build: venv
	$(CARGO) build --release

bench: venv
	$(CARGO) bench --bench benches

# The GPU-only tests, built and stripped into .gpu/tests/ for a GPU host (docs/gpu.md runs them).
gpu-tests: venv
	sh tests/tools/gpu_tests.sh

venv: $(LIBTORCH_LINK)

# The stamp is the link to torch's directory inside the venv: present means installed.
$(LIBTORCH_LINK):
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check torch==$(TORCH_VERSION) \
		"nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*"
	cd $(VENV) && ln -sfn "$$(bin/python -c 'import torch, os; print(os.path.relpath(os.path.dirname(torch.__file__)))')" libtorch
	@echo "libtorch $(TORCH_VERSION) ready in $(LIBTORCH_LINK)"

clean-venv:
	rm -rf $(VENV)
