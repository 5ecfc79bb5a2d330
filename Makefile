# Entry points. Every target sets up what it needs (venv, packages, lab tools) and reuses it next time.
#   make course  the main job: every lesson executed against the offline lab, figures, the book
#   make test    everything CI runs (the Colab rehearsal included)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DATAFERRY_TOOLS ?= $(CURDIR)/build/tools
PYTEST_ARGS ?=

.PHONY: venv tools browser colab-venv colab-rehearsal test typecheck course lab lab-down bench-cache bench-shards bench-train bench-lab clean

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

# A virtual environment with Colab's preinstalled versions (scripts/colab/pip-freeze.txt), for the rehearsal.
colab-venv: venv
	@$(PY) scripts/colab_rehearsal.py setup

# Every lesson executed as Colab runs it: Colab's versions, the setup cell's real install, no Go.
colab-rehearsal: tools colab-venv
	$(PY) scripts/colab_rehearsal.py

test: tools browser colab-venv typecheck
	$(PY) -m pytest $(PYTEST_ARGS)

# mypy over the package, as helpers/pyproject.toml sets it (the cache's parts fully annotated).
typecheck: venv
	cd helpers && ../$(PY) -m mypy

course: tools
	$(PY) scripts/course.py

lab: tools
	$(VENV)/bin/dataferry lab demo

bench-cache: tools
	$(PY) -m benchmarks cache --out build/bench/cache.json

bench-shards: tools
	MPLBACKEND=Agg $(PY) -m benchmarks shards --out build/bench/shards.json

bench-train: tools
	$(PY) -m pip install --quiet -e "./helpers[all,feed-peers]"
	$(PY) -m benchmarks train --out build/bench/train.json

bench-lab: tools
	MPLBACKEND=Agg $(VENV)/bin/dataferry bench --lab --out build/bench/methods --json build/bench/methods.json

lab-down: venv
	$(VENV)/bin/dataferry lab down

clean:
	rm -rf $(VENV) build
