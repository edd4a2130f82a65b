# Two commands a newcomer needs: `make pipeline` (the whole tiny run) and `make test`.
# Both create or refresh .venv themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PRESET ?= tiny
RUN ?= runs/$(PRESET)

.PHONY: venv vllm llamacpp engines sandbox tools pipeline test export notebooks clean docs

$(BIN)/.installed: settings.ini setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

# vLLM pins its own torch and transformers: it gets an environment of its own, which the serving stage starts.
vllm:
	bash scripts/vllm_env.sh

# llama.cpp (the GGUF q8_0/q4_0 formats and the `llamacpp` serving engine): llama-cpp-python compiled for this CPU into
# .venv (~2 min on 2 cores, once) and llama.cpp's Hugging Face -> GGUF converter into .tools/llama.cpp.
llamacpp: venv
	PY=$(BIN)/python bash scripts/llamacpp.sh

# Both, side by side: vLLM's environment is mostly downloading and unpacking, llama.cpp's build is compiling, so a fresh
# machine's setup takes about the longer of the two instead of their sum.
engines: venv
	@bash scripts/vllm_env.sh & v=$$!; PY=$(BIN)/python bash scripts/llamacpp.sh; l=$$?; wait $$v; v=$$?; \
	  [ $$l = 0 ] || echo "make engines: llama.cpp's build failed (see above)"; [ $$v = 0 ] || echo "make engines: vLLM's environment failed (see above)"; \
	  [ $$l = 0 ] && [ $$v = 0 ]

# The evaluation sandbox mounts a private file system with bubblewrap (Debian/Ubuntu: bubblewrap); prlimit and
# setpriv come with util-linux. As root they are installed here; otherwise the sandbox says what it lacks.
sandbox:
	@command -v bwrap >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
	  apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null)
	@command -v bwrap >/dev/null || echo "note: bubblewrap (bwrap) is not installed: samples run without a private file system"

# promtool, which tests/test_deploy.py runs on deploy/prometheus: into .tools/bin, no root needed.
tools:
	bash scripts/promtool.sh

pipeline: venv engines sandbox
	$(BIN)/codellm pipeline --preset $(PRESET) --run-dir $(RUN)

test: venv engines sandbox tools
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/test.sh

export: venv
	$(BIN)/nbdev_export && $(BIN)/nbdev_clean

# Re-run the notebooks in place (their stored outputs), e.g. after a change to what they show.
notebooks: venv engines sandbox
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/run_notebooks.sh

docs: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/docs.sh

clean:
	rm -rf runs/nbtest runs/pytest _proc _docs
