"""One BFCL step is bounded whatever the model writes: calls past the per-step limit and past the step's time are
answered, not run; each result is cut; a call that would nest the backend's state too deep is not applied."""

from __future__ import annotations

import pytest

from trace_gym.environments.bfcl import backends
from trace_gym.environments.bfcl.env import BFCLMultiTurnEnv
from trace_gym.tasks import Task


def _task(env: BFCLMultiTurnEnv, backend: str) -> Task:
    return next(t for t in env.tasks if backend in t.meta["involved_classes"])


def _replies(info: dict) -> list[str]:
    messages = info["messages"]
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return [m["content"] for m in messages[last + 1:]]


@pytest.fixture(scope="module")
def env():
    e = BFCLMultiTurnEnv("multi_turn_base", split="all", max_calls_per_step=2, step_time_s=60.0, max_result_chars=30)
    yield e
    e.close()


def test_calls_past_the_per_step_limit_are_answered_not_run(env) -> None:
    env.reset(options={"task": _task(env, "MathAPI")})
    *_, info = env.step("[add(a=1, b=2), add(a=3, b=4), add(a=5, b=6)]")
    replies = _replies(info)
    assert '"result": 3' in replies[0] and '"result": 7' in replies[1]
    assert replies[2] == "Error: not run: over the limit of 2 function calls per step; make it in the next step"
    assert env.model_results == replies[:2] and "not run" in info["error"]


def test_calls_past_the_steps_time_are_answered_not_run() -> None:
    env = BFCLMultiTurnEnv("multi_turn_base", split="all", step_time_s=2.0)
    env.reset(options={"task": _task(env, "MathAPI")})
    *_, info = env.step("[power(base=10, exponent=100000000), add(a=1, b=2)]")
    slow, late = _replies(info)
    assert "stopped" in slow and "timed out after 2 s" in slow
    assert late == "Error: not run: this step's calls took its 2 s; make it in the next step"
    env.close()


def test_each_result_is_cut_at_max_result_chars(env) -> None:
    env.reset(options={"task": _task(env, "GorillaFileSystem")})
    obs, *_ = env.step(f"[echo(content='{'x' * 100}')]")
    assert obs.startswith('{"terminal_output": "xxxxxxxxx') and obs.endswith("characters]")
    assert len(obs.split("\n")[0]) == 30 and len(env.model_results[-1]) == len(obs)


def test_a_call_that_would_nest_the_state_too_deep_is_not_applied() -> None:
    env = BFCLMultiTurnEnv("multi_turn_base", split="all", max_calls_per_step=200, step_time_s=300.0)
    env.reset(options={"task": _task(env, "GorillaFileSystem")})
    calls = ", ".join(["mkdir(dir_name='d'), cd(folder='d')"] * (backends.MAX_STATE_DEPTH // 2))
    *_, info = env.step(f"[{calls}]")
    refused = [r for r in _replies(info) if "not applied" in r]
    assert refused and refused[0].startswith("Error: the call was not applied: the backend's state would nest")
    assert backends.state_depth_problem(env.instances) is None
    env.snapshot()  # what is kept can be copied
    env.close()
