# Two commands a newcomer needs: `make pipeline` (the whole tiny run) and `make test`.
# Both create or refresh .venv themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PRESET ?= tiny
RUN ?= runs/$(PRESET)

.PHONY: venv vllm llamacpp llamacpp-wheel setup sandbox tools browser system-packages pipeline test test-stress export notebooks clean docs lab

$(BIN)/.installed: settings.ini setup.py
	@$(PYTHON) scripts/check_python.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

# vLLM pins its own torch and transformers: it gets an environment of its own, which the serving stage starts.
vllm:
	bash scripts/vllm_env.sh

# llama.cpp (the GGUF q8_0/q4_0 formats and the `llamacpp` serving engine): llama-cpp-python compiled for this CPU into
# a wheel (~2 min on 2 cores, once), installed into .venv, and llama.cpp's Hugging Face -> GGUF converter into .tools/llama.cpp.
llamacpp: venv
	PY=$(BIN)/python PYTHON=$(PYTHON) bash scripts/llamacpp.sh

# The wheel alone: it needs no .venv, so it compiles while .venv installs.
llamacpp-wheel:
	PYTHON=$(PYTHON) bash scripts/llamacpp.sh --wheel-only

# What the pipeline runs on, side by side: .venv and vLLM's environment mostly download and unpack, llama.cpp's wheel
# mostly compiles, the system packages (one apt at a time) wait on the network; then the wheel goes into .venv (seconds).
# A fresh machine's setup takes about the longest of them instead of their sum. The tests add Chromium and promtool.
SYSTEM ?= sandbox
setup:
	@$(MAKE) --no-print-directory -j5 venv vllm llamacpp-wheel $(SYSTEM)
	@$(MAKE) --no-print-directory llamacpp

# The evaluation sandbox mounts a private file system with bubblewrap (Debian/Ubuntu: bubblewrap); prlimit and
# setpriv come with util-linux. As root they are installed here; otherwise the sandbox says what it lacks.
sandbox:
	@command -v bwrap >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
	  apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null)
	@command -v bwrap >/dev/null || echo "note: bubblewrap (bwrap) is not installed: samples run without a private file system"

# promtool, which tests/test_deploy.py runs on deploy/prometheus, and the Continue CLI, which tests/test_clients.py points at
# the gateway: into .tools/, no root needed (the CLI from npm).
tools:
	bash scripts/promtool.sh
	bash scripts/clients.sh

# Headless Chromium, in which the docs are checked as a reader sees them (tests/test_docs.py). As root on Debian/Ubuntu
# it is installed here (Playwright drives the system's browser: nothing is downloaded from its CDN).
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
	  apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || echo "note: chromium is not installed: the docs' browser checks will fail (install it, e.g. apt-get install chromium)"

pipeline: setup
	$(BIN)/codellm pipeline --preset $(PRESET) --run-dir $(RUN)

test: SYSTEM = system-packages tools
test: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/test.sh

# The concurrency-sensitive tests five times under a CPU hog, and the generated-input tests with ten times the examples
# (about an hour on 2 cores): a test that can fail under load fails here first.
test-stress: SYSTEM = system-packages tools
test-stress: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/stress.sh

system-packages:
	@$(MAKE) --no-print-directory sandbox; $(MAKE) --no-print-directory browser

export: venv
	$(BIN)/nbdev_export && $(BIN)/nbdev_clean

# Re-run the notebooks in place (their stored outputs), e.g. after a change to what they show.
notebooks: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/run_notebooks.sh

# The site (_docs/site/index.html) and README.md, from the notebooks' stored outputs; nothing is executed.
docs: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/docs.sh

# JupyterLab on the notebooks, with the project's environment as the kernel; LAB_ARGS for more (e.g. --no-browser --port 8890).
# As root (a container) JupyterLab refuses to start unless told it may.
lab: venv
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (codellm_nb)" >/dev/null
	cd nbs && PATH="$(CURDIR)/$(BIN):$$PATH" $(CURDIR)/$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

clean:
	rm -rf runs/nbtest runs/pytest _proc _docs
