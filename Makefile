# The README's commands. Each works on a fresh machine with Python 3.11, make and the package registries.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: venv test quickstart bench lint clean

venv: $(STAMP)

# Re-runs only when the dependency list changes. torch goes first and alone: pip otherwise takes a CUDA build.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[train,ray,bfcl,dev]'
	$(PIP) install --quiet --no-deps bfcl-eval==2026.3.23 mpmath
	touch $(STAMP)

lint: venv
	$(VENV)/bin/ruff check .

# The viewer's browser tests need Debian's chromium; the script does nothing when it is already installed.
test: venv
	bash scripts/install_chromium.sh
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

quickstart: venv
	$(VENV)/bin/trace-gym rollout --env trace/HotpotQA-v0 --policy expert --episodes 20 --branches 3 --out runs/quickstart/trees.jsonl

bench: venv
	$(PY) benchmarks/retrieval.py --quick
	$(PY) benchmarks/snapshot.py

clean:
	rm -rf $(VENV) build *.egg-info
