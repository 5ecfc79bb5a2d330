# Entry points. Every target sets up what it needs (venv, packages, lab tools) and reuses it next time.
#   make course  the main job: every lesson executed against the offline lab, figures, the book
#   make test    everything CI runs
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DATAFERRY_TOOLS ?= $(CURDIR)/build/tools
PYTEST_ARGS ?=

.PHONY: venv tools browser test course lab lab-down bench-cache bench-lab clean

$(STAMP): helpers/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "dataferry needs Python >= 3.10; set PYTHON=python3.x")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e "./helpers[all]"
	@touch $@

venv: $(STAMP)

tools: venv
	@$(VENV)/bin/dataferry lab build

# Debian's Chromium, for the test that opens the built book in a real browser.
browser:
	@command -v chromium >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

test: tools browser
	$(PY) -m pytest $(PYTEST_ARGS)

course: tools
	$(PY) scripts/course.py

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
