"""`vf-eval` (verifiers 0.4) runs trace-gym envs: the taskset and harness of trace_gym_verifiers against a real
local OpenAI-shaped server that plays the env's expert; the rewards are the env's. `vf-validate` passes them
(the expert as gold, untouched tasks scoring 0), and task data cannot choose the env."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers")

from tests.agents.openai_server import ExpertScript, ScriptedServer
from tests.training.parity_env import ENTRY_POINT
from trace_gym.env_specs import env_factory

ROOT = Path(__file__).resolve().parents[2]
VF_EVAL = shutil.which("vf-eval", path=str(Path(sys.executable).parent)) or "vf-eval"


def vf_eval(server: ScriptedServer, out: Path, *args: str) -> list[dict]:
    env = {**os.environ, "PRIME_API_KEY": "local", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([VF_EVAL, "trace_gym_verifiers", *args, "--model", "m", "--client.base-url",
                             server.url.removesuffix("/v1"), "--no-rich", "--no-push", "--output-dir", str(out)],
                            capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    episodes = [json.loads(line) for path in out.rglob("traces.jsonl") for line in path.read_text().splitlines()]
    traces = [t for e in episodes for t in e["traces"]]
    assert traces and all(t["ok"] for t in traces), json.dumps([t["errors"] for t in traces])[:3000]
    return traces


def rewards(traces: list[dict]) -> dict[str, float]:
    return {t["task"]["data"]["task_id"]: t["rewards"]["env_reward"]["score"] for t in traces}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["text", "native"])
def test_vf_eval_scores_a_trace_gym_env_with_its_own_rewards(tmp_path, mode):
    """Native: the server answers the OpenAI way (tool calls, then a plain final answer)."""
    make_env = env_factory("trace/Arithmetic-v0", {"n_tasks": 4})
    with ScriptedServer(ExpertScript(make_env, "text" if mode == "text" else "openai")) as server:
        traces = vf_eval(server, tmp_path, "--env.taskset.env", "trace/Arithmetic-v0", "--env.taskset.env-args",
                         '{"n_tasks": 4}', "-n", "4", "--env.agent.harness.id", "trace_gym_verifiers",
                         "--env.agent.harness.tool-calls", mode)
    assert rewards(traces) == {f"arith-{i}": 1.0 for i in range(4)}  # the expert solves every task
    posts = [r for r in server.requests if r["path"].endswith("/chat/completions")]
    assert len(posts) == 8  # two turns per episode: the tool call, then the answer, through the interception
    assert all(t["metrics"]["trace_gym_turns"] == 2 for t in traces)


@pytest.mark.slow
def test_vf_eval_runs_a_users_own_env_named_by_module_and_class(tmp_path):
    even = ScriptedServer(lambda path, body: _reply("four" if len(body["messages"]) > 2 else "hi"))
    with even as server:
        traces = vf_eval(server, tmp_path, "--env.taskset.env", ENTRY_POINT, "-n", "3")
    assert sorted(rewards(traces).values()) == [1.0, 1.0, 1.0]


@pytest.mark.slow
def test_vf_validate_passes_with_the_expert_as_gold(tmp_path):
    result = subprocess.run([shutil.which("vf-validate", path=str(Path(sys.executable).parent)) or "vf-validate",
                             "trace_gym_verifiers", "--taskset.env", "trace/Arithmetic-v0", "--taskset.env-args",
                             '{"n_tasks": 3}', "-n", "3", "--runtime.type", "subprocess", "--no-rich",
                             "--output-dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    summary = json.loads(next(tmp_path.rglob("summary.json")).read_text())
    assert summary["checks"]["gold"]["valid"] == 3 and summary["checks"]["noop"]["valid"] == 3
    assert summary["valid_rate"] == 1.0


def test_task_data_cannot_choose_the_env():
    """A row naming an env spec (code to import) or env args (a data_path) that no operator's taskset loaded is
    refused before anything is built or contacted."""
    import asyncio

    from trace_gym.agents.vf_env import TraceGymData, TraceGymHarness, TraceGymHarnessConfig, TraceGymTask
    from trace_gym.errors import ConfigError

    data = TraceGymData(idx=0, id="x", prompt="hi", env=ENTRY_POINT, env_args={"data_path": "/etc/shadow"},
                        task_id="x")
    with pytest.raises(ConfigError, match="task data may pick a task, not the env"):
        TraceGymHarness(TraceGymHarnessConfig()).play(None, "http://127.0.0.1:9/v1", "s", data)
    with pytest.raises(ConfigError, match="not the env"):
        asyncio.run(TraceGymTask(data).validate(None))


def _reply(text: str):
    from tests.agents.openai_server import message_reply

    return message_reply({"role": "assistant", "content": text})


MIXED = {"a": {"env": ENTRY_POINT, "env_args": {"n_tasks": 2}},
         "b": {"env": ENTRY_POINT, "env_args": {"n_tasks": 1, "task_seed": 1}}}


def test_a_taskset_of_several_operator_envs_keys_each_task_by_its_env():
    from trace_gym.agents.vf_env import TraceGymTaskset, TraceGymTasksetConfig

    tasks = list(TraceGymTaskset(TraceGymTasksetConfig(envs=MIXED)))
    assert [(t.data.id, t.data.env_key, t.data.task_id) for t in tasks] == [
        ("a/p0-0", "a", "p0-0"), ("a/p0-1", "a", "p0-1"), ("b/p1-0", "b", "p1-0")]
    assert [t.data.env_args for t in tasks] == [{"n_tasks": 2}] * 2 + [{"n_tasks": 1, "task_seed": 1}]


def test_task_data_names_only_an_operator_key_with_that_envs_own_settings():
    """A row may name an operator's key, but not pair it with another env or other args, nor name a key no
    operator gave; refused before anything is built or contacted."""
    from trace_gym.agents.vf_env import TraceGymData, TraceGymHarness, TraceGymHarnessConfig, TraceGymTaskset
    from trace_gym.agents.vf_env import TraceGymTasksetConfig as Config
    from trace_gym.errors import ConfigError

    list(TraceGymTaskset(Config(envs=MIXED)))
    harness = TraceGymHarness(TraceGymHarnessConfig())
    for key, env, args in [("a", "trace/Arithmetic-v0", {}), ("a", ENTRY_POINT, {"data_path": "/etc/shadow"}),
                           ("zz", ENTRY_POINT, {"n_tasks": 2})]:
        data = TraceGymData(idx=0, id="x", prompt="hi", env=env, env_args=args, task_id="p0-0", env_key=key)
        with pytest.raises(ConfigError, match="operator's env keys"):
            harness.play(None, "http://127.0.0.1:9/v1", "s", data)
    with pytest.raises(ConfigError, match="envs or its env"):
        list(TraceGymTaskset(Config(env=ENTRY_POINT, envs=MIXED)))
    with pytest.raises(ConfigError, match="env keys of letters"):
        list(TraceGymTaskset(Config(envs={"../a": MIXED["a"]})))


@pytest.mark.slow
def test_vf_eval_plays_each_operator_env_and_reports_each_apart(tmp_path):
    even = ScriptedServer(lambda path, body: _reply("four" if len(body["messages"]) > 2 else "hi"))
    with even as server:
        traces = vf_eval(server, tmp_path, "--env.taskset.envs", json.dumps(MIXED), "-n", "3",
                         "--env.agent.harness.id", "trace_gym_verifiers", "--env.agent.harness.tool-calls", "text")
    by_id = {t["task"]["data"]["id"]: t for t in traces}
    assert sorted(by_id) == ["a/p0-0", "a/p0-1", "b/p1-0"]
    for tid, trace in by_id.items():
        key = tid.split("/")[0]
        assert trace["metrics"][f"trace_gym_reward/{key}"] == trace["rewards"]["env_reward"]["score"] == 1.0
