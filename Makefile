# Entry points. Every target sets up what it needs (venv, packages, lab tools) and reuses it next time.
#   make lab    a one-minute tour of the offline lab (the course's main job until lessons land)
#   make test   everything CI runs
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DATAFERRY_TOOLS ?= $(CURDIR)/build/tools
PYTEST_ARGS ?=

.PHONY: venv tools test lab lab-down bench-cache bench-lab clean

$(STAMP): helpers/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "dataferry needs Python >= 3.10; set PYTHON=python3.x")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e "./helpers[all]"
	@touch $@

venv: $(STAMP)

tools: venv
	@$(VENV)/bin/dataferry lab build

test: tools
	$(PY) -m pytest $(PYTEST_ARGS)

lab: tools
	$(VENV)/bin/dataferry lab demo

bench-cache: tools
	$(VENV)/bin/dataferry bench-cache --out build/bench/cache.json

bench-lab: tools
	MPLBACKEND=Agg $(VENV)/bin/dataferry bench --lab --out build/bench/methods --json build/bench/methods.json

lab-down: venv
	$(VENV)/bin/dataferry lab down

clean:
	rm -rf $(VENV) build
