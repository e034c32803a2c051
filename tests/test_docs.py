"""The API reference: `mkdocs build --strict` (what `make docs` runs) builds it with no broken reference, its
pages document the public classes, and those classes' public methods all have docstrings (an undocumented
method would silently drop out of the reference)."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = {
    "trace_gym.env": ["TextEnv", "ToolEnv", "Turn"], "trace_gym.tools": ["Tool"], "trace_gym.tasks": ["Task"],
    "trace_gym.wrappers": ["TreeRolloutWrapper"], "trace_gym.tree": ["RolloutTree", "Node"],
    "trace_gym.snapshot": ["NativeSnapshot", "ReplaySnapshot"], "trace_gym.env_specs": ["EnvFactory"],
    "trace_gym.agents.policy": ["Policy", "SamplingParams", "Request", "Generation"],
    "trace_gym.agents.hf": ["HFPolicy"], "trace_gym.agents.vllm": ["VLLMPolicy"],
    "trace_gym.agents.openai_backend": ["OpenAIPolicy"], "trace_gym.agents.scripted": ["ExpertPolicy"],
    "trace_gym.agents.specs": ["PolicyOptions"], "trace_gym.training.driver.trainer": ["Trainer"],
    "trace_gym.training.config": ["TrainConfig"],
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.mark.parametrize(("page", "names"), [
    ("api/envs.html", ["TextEnv", "ToolEnv", "verify", "load_tasks", "Tool", "Task", "Turn", "env_factory"]),
    ("api/trees.html", ["TreeRolloutWrapper", "branch", "RolloutTree"]),
    ("api/policies.html", ["SamplingParams", "HFPolicy", "VLLMPolicy", "OpenAIPolicy", "policy_from_spec"]),
    ("api/training.html", ["Trainer", "TrainConfig", "AllocConfig", "roots", "save_trees"]),
])
def test_the_reference_documents_the_public_classes(site, page, names):
    html = (site / page).read_text()
    assert all(name in html for name in names), [n for n in names if n not in html]


def _undocumented(cls: type) -> list[str]:
    out = []
    for name, value in vars(cls).items():
        target = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
        target = getattr(target, "func", target)  # cached_property
        if not name.startswith("_") and callable(target) and not inspect.getdoc(getattr(cls, name, target)):
            out.append(name)
    return out


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_methods_have_docstrings(module):
    mod = importlib.import_module(module)
    missing = {name: _undocumented(getattr(mod, name)) for name in PUBLIC[module]}
    assert all(getattr(mod, name).__doc__ for name in PUBLIC[module])
    assert not any(missing.values()), missing
