"""Every example of docs/integrations.md runs as written: the Python blocks as scripts, the vf-eval command
against a real local server that plays the env's expert (its URL and model swapped in)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agents.openai_server import ExpertScript, ScriptedServer
from trace_gym.env_specs import env_factory

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "integrations.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", DOC, flags=re.DOTALL)
EXPECTED = {"env.branch": "branch rewards: 1.0, 0.0", "GenericEnvClient": "1.0 True 2", "skyrl_gym": "1.0 True 0.0",
            "GRPOTrainer": "4 steps; reward mean", "trl_environment": "[1.0]"}
CWD_ROOT = {"GRPOTrainer"}  # examples that read a committed file, as the page says: run from the repository root
NEEDS = {"env.branch": "fastapi", "GenericEnvClient": "openenv", "skyrl_gym": "skyrl_gym", "GRPOTrainer": "trl",
         "trl_environment": "datasets"}


def run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRL_EXPERIMENTAL_SILENCE": "1", "PRIME_API_KEY": "local"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=900)


def test_the_page_has_an_example_of_each_adapter():
    assert [next(k for k in EXPECTED if k in block) for block in BLOCKS] == list(EXPECTED)


@pytest.mark.slow
@pytest.mark.parametrize("key", list(EXPECTED))
def test_each_python_example_runs_as_written(key, tmp_path):
    if NEEDS[key]:
        pytest.importorskip(NEEDS[key])
    block = next(b for b in BLOCKS if key in b)
    result = run(block, ROOT if key in CWD_ROOT else tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert EXPECTED[key] in result.stdout, result.stdout[-2000:]
    if key == "GRPOTrainer":  # the example trains: some step's groups mixed outcomes and moved the weights
        losses = json.loads(re.search(r"^loss (\[.*?\])", result.stdout, flags=re.MULTILINE).group(1))
        assert any(loss != 0.0 for loss in losses), result.stdout[-2000:]


@pytest.mark.slow
def test_the_vf_eval_command_runs_against_a_server(tmp_path):
    pytest.importorskip("verifiers")
    line = next(c for block in re.findall(r"```bash\n(.*?)```", DOC, flags=re.DOTALL) for c in block.splitlines()
                if c.startswith("vf-eval"))
    with ScriptedServer(ExpertScript(env_factory("trace/Arithmetic-v0", {"n_tasks": 4}), "openai")) as server:
        command = line.replace("http://127.0.0.1:8000", server.url.removesuffix("/v1"))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PRIME_API_KEY": "local",
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=tmp_path, env=env,
                                timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    episodes = [json.loads(x) for p in (tmp_path / "outputs").rglob("traces.jsonl") for x in p.read_text().split("\n")
                if x]
    assert [t["rewards"]["env_reward"]["score"] for e in episodes for t in e["traces"]] == [1.0] * 4


@pytest.mark.slow
def test_the_vf_validate_command_runs_and_passes(tmp_path):
    pytest.importorskip("verifiers")
    line = next(c for block in re.findall(r"```bash\n(.*?)```", DOC, flags=re.DOTALL) for c in block.splitlines()
                if c.startswith("vf-validate"))
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": path}
    result = subprocess.run(["bash", "-c", line], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    summary = json.loads(next((tmp_path / "outputs").rglob("summary.json")).read_text())
    assert summary["valid_rate"] == 1.0 and summary["outcomes"]["valid"] == 4
