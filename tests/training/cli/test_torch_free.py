"""`trace-gym eval` and `trace-gym rollout` with the scripted expert on the base install, in a venv of its own that
holds the base requirements alone (no torch, no transformers), built from this interpreter's installed copies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[3]
TRAIN_ONLY = ("torch", "transformers", "tokenizers", "peft", "accelerate", "matplotlib")


def sysconfig_site() -> list[str]:
    """This interpreter's site-packages folders."""
    import site

    return site.getsitepackages()


def _base_closure() -> set[str]:
    """The distributions that ``pip install trace-gym`` pulls: the base requirements and theirs, no extras."""
    base = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    todo, seen = [Requirement(r) for r in base], set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            todo += [Requirement(r) for r in distribution(req.name).requires or []]
        except PackageNotFoundError:  # a marker-less requirement this machine does not need (none today)
            continue
    return seen


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> Path:
    """A venv (no system site-packages) whose site-packages links the base closure's installed files only."""
    venv = tmp_path_factory.mktemp("base") / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for name in _base_closure():
        dist = distribution(name)
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            src, dst = Path(dist.locate_file(top)), site / top
            if src.exists() and not dst.exists() and not top.endswith(".pth"):
                dst.symlink_to(src)
    # This checkout's code as its editable install maps it (trace_gym.training -> training/, ...): the finder
    # module and the .pth that installs it, the project's own installed files.
    for f in sorted(p for d in sysconfig_site() for p in Path(d).glob("__editable__*trace_gym*")):
        (site / f.name).symlink_to(f)
    return venv


def _run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run([str(venv / "bin" / "python"), *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_the_base_venv_has_no_torch(base_venv, tmp_path):
    for name in TRAIN_ONLY:
        result = _run(base_venv, "-c", f"import {name}", cwd=tmp_path)
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, name


def test_eval_and_rollout_with_the_expert_need_no_torch(base_venv, tmp_path):
    cli = ("-m", "trace_gym.training.cli")
    ev = _run(base_venv, *cli, "eval", "--env", "trace/Arithmetic-v0", "--policy", "expert", "--tasks", "4",
              "--json", cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert json.loads(ev.stdout)["success"] == 1.0
    ro = _run(base_venv, *cli, "rollout", "--env", "trace/Arithmetic-v0", "--policy", "expert:0.3", "--tasks", "2",
              "--out", str(tmp_path / "trees.jsonl"), cwd=tmp_path)
    assert ro.returncode == 0, ro.stderr[-3000:]
    trees = [json.loads(line) for line in (tmp_path / "trees.jsonl").read_text().splitlines()]
    assert len(trees) == 2 and all(len(t["nodes"]) > 1 for t in trees)


def test_the_readme_python_eval_example_needs_no_torch(base_venv, tmp_path):
    readme = (ROOT / "README.md").read_text()
    blocks = readme.split("```python\n")[1:]
    example = next(b.split("```")[0] for b in blocks if "evaluate_policy" in b and "expert:" in b)
    result = _run(base_venv, "-c", example, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("success ") and "over 100 episodes" in result.stdout
