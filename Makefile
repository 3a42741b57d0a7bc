# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
# Both install libtorch (the torch==2.11.0 wheel from PyPI) into .venv first when it is missing.

PYTHON ?= python3
VENV := .venv
TORCH_VERSION := 2.11.0
LIBTORCH_LINK := $(VENV)/libtorch
CARGO ?= cargo

.PHONY: run test venv build release bench clean-venv

run: venv
	$(CARGO) run --release --

test: venv
	$(CARGO) test --all-targets

build: venv
	$(CARGO) build --release

bench: venv
	$(CARGO) bench --bench benches

venv: $(LIBTORCH_LINK)

# The stamp is the link to torch's directory inside the venv: present means installed.
$(LIBTORCH_LINK):
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check torch==$(TORCH_VERSION)
	cd $(VENV) && ln -sfn "$$(bin/python -c 'import torch, os; print(os.path.relpath(os.path.dirname(torch.__file__)))')" libtorch
	@echo "libtorch $(TORCH_VERSION) ready in $(LIBTORCH_LINK)"

clean-venv:
	rm -rf $(VENV)
