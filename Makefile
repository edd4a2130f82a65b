# Two commands a newcomer needs: `make pipeline` (the whole tiny run) and `make test`.
# Both create or refresh .venv themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PRESET ?= tiny
RUN ?= runs/$(PRESET)

.PHONY: venv pipeline test export clean docs

$(BIN)/.installed: settings.ini setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

pipeline: venv
	$(BIN)/codellm pipeline --preset $(PRESET) --run-dir $(RUN)

test: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/test.sh

export: venv
	$(BIN)/nbdev_export && $(BIN)/nbdev_clean

docs: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/docs.sh

clean:
	rm -rf runs/nbtest runs/pytest _proc _docs
