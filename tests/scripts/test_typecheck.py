"""scripts/typecheck.py: the installed layout it type-checks, and its findings named by their checkout paths."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("typecheck_script", ROOT / "scripts" / "typecheck.py")
assert _SPEC is not None and _SPEC.loader is not None
typecheck = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(typecheck)

FOLDERS = ("trace_gym", "environments", "agents", "training", "trace_gym_verifiers")


def test_layout_puts_each_file_under_its_module_name(tmp_path):
    origin = typecheck.assemble(tmp_path)
    assert origin["trace_gym/training/step.py"] == "training/step.py"
    assert origin["trace_gym/environments/sandbox/runtime.py"] == "environments/sandbox/runtime.py"
    assert origin["trace_gym/agents/policy.py"] == "agents/policy.py"
    assert origin["trace_gym/env.py"] == "trace_gym/env.py"
    assert origin["trace_gym_verifiers/__init__.py"] == "trace_gym_verifiers/__init__.py"
    assert all((tmp_path / placed).read_bytes() == (ROOT / source).read_bytes() for placed, source in origin.items())


def test_layout_holds_every_python_file_of_the_packages_once(tmp_path):
    origin = typecheck.assemble(tmp_path)
    files = {p.relative_to(ROOT).as_posix() for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")
             if "__pycache__" not in p.parts}
    assert sorted(origin.values()) == sorted(files)
    assert len(origin) >= 100
    assert not (tmp_path / "training").exists()  # nothing under its checkout name, which no import resolves


def test_layout_is_rebuilt_from_scratch(tmp_path):
    stale = tmp_path / "trace_gym" / "training" / "removed_since.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("x: int = 'a stale copy that would be checked'\n")
    typecheck.assemble(tmp_path)
    assert not stale.exists()


def test_findings_name_the_checkout_file():
    origin = {"trace_gym/training/step.py": "training/step.py"}
    line = 'trace_gym/training/step.py:52: error: Name "x" is not defined  [name-defined]'
    assert typecheck.to_checkout(line, origin) == 'training/step.py:52: error: Name "x" is not defined  [name-defined]'
    assert typecheck.to_checkout("trace_gym/env.py:3: note: see", origin) == "trace_gym/env.py:3: note: see"
    summary = "Found 1 error in 1 file (checked 142 source files)"
    assert typecheck.to_checkout(summary, origin) == summary
