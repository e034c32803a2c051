"""BFCL env behaviour: conformance, turn flow, miss_func reveal, step limit, hostile input, snapshots."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym.checker import check_trace_env
from trace_gym.environments.bfcl.data import MULTI_TURN_CATEGORIES, SINGLE_TURN_CATEGORIES
from trace_gym.environments.bfcl.env import MAX_STEPS_PER_TURN, BFCLMultiTurnEnv, BFCLSingleTurnEnv


@pytest.mark.parametrize("category", MULTI_TURN_CATEGORIES)
def test_multi_turn_env_passes_conformance(category):
    check_trace_env(functools.partial(BFCLMultiTurnEnv, category), seed=0)


@pytest.mark.parametrize("category", SINGLE_TURN_CATEGORIES)
def test_single_turn_env_passes_conformance(category):
    check_trace_env(functools.partial(BFCLSingleTurnEnv, category), seed=0)


def test_plain_reply_ends_the_user_turn_and_shows_the_next_message():
    env = BFCLMultiTurnEnv("multi_turn_base", split="all")
    obs, info = env.reset(options={"index": 0})
    task = env.task
    assert obs == task.meta["question"][0][0]["content"] and info["tools"]
    _, _, terminated, _, info = env.step("[" + ", ".join(task.answer[0]) + "]")
    assert not terminated and info["user_turn"] == 0 and "error" not in info
    obs, _, terminated, _, info = env.step("Done.")
    assert obs == task.meta["question"][1][0]["content"] and info["turn_verdict"] == {"valid": True}
    assert info["messages"][-1] == {"role": "user", "content": obs}


def test_skipping_a_turn_fails_the_episode():
    env = BFCLMultiTurnEnv("multi_turn_base", split="all")
    env.reset(options={"index": 0})
    _, _, _, _, info = env.step("Nothing to do.")
    assert info["turn_verdict"]["error_type"] == "multi_turn:empty_turn_model_response"
    reward, terminated = 0.0, False
    while not terminated:
        _, reward, terminated, _, _ = env.step("ok")
    assert reward == 0.0


def test_miss_func_reveals_the_held_out_function_with_the_follow_up_message():
    env = BFCLMultiTurnEnv("multi_turn_miss_func", split="all")
    _, info = env.reset(options={"task_id": "multi_turn_miss_func_0"})
    task = env.task
    turn = int(next(iter(task.meta["missed_function"])))
    held = task.meta["missed_function"][str(turn)]
    assert not {t["function"]["name"] for t in info["tools"]} & set(held)
    for t in range(turn):
        if task.answer[t]:
            env.step("[" + ", ".join(task.answer[t]) + "]")
        obs, _, _, _, info = env.step("Done.")
    assert obs.startswith("I have updated some more functions") and all(name in obs for name in held)
    assert set(held) <= {t["function"]["name"] for t in info["tools"]}


def test_step_limit_ends_the_episode_with_zero():
    env = BFCLMultiTurnEnv("multi_turn_base", split="all")
    env.reset(options={"index": 0})
    for _ in range(MAX_STEPS_PER_TURN):
        _, _, terminated, _, _ = env.step("[pwd()]")
        assert not terminated
    _, reward, terminated, _, info = env.step("[pwd()]")
    assert terminated and reward == 0.0 and info["stop_reason"] == "step_limit"


def test_hostile_call_is_an_error_observation_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    env = BFCLMultiTurnEnv("multi_turn_base", split="all")
    env.reset(options={"index": 0})
    for action in [f"[__import__('os').system('touch {marker}')]", f"[cd(folder=exec('open(\"{marker}\",\"w\")'))]",
                   '<tool_call>{"name": "__class__", "arguments": {}}</tool_call>',
                   '<tool_call>{"name": "_load_scenario", "arguments": {"scenario": {}}}</tool_call>',
                   "<tool_call>{not json</tool_call>"]:
        obs, _, terminated, _, info = env.step(action)
        assert obs.startswith("Error") and info["error"] and not terminated, action
    assert not marker.exists()


def test_native_snapshot_branches_are_independent():
    env = BFCLMultiTurnEnv("multi_turn_base", split="all")
    env.reset(options={"index": 0})
    snap = env.snapshot("native")
    env.step("[mkdir(dir_name='branch_a')]")
    obs_a, _, _, _, _ = env.step("[ls()]")
    env.restore(snap)
    obs_b, _, _, _, _ = env.step("[ls()]")
    assert "branch_a" in obs_a and "branch_a" not in obs_b
    env.restore(snap)
    assert env.step("[ls()]")[0] == obs_b


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(max_size=80) | st.sampled_from(["[ls()]", "[cd(folder='x')]", "Done.", "[pwd(", "[]"]),
                min_size=1, max_size=6))
def test_arbitrary_actions_never_raise(actions):
    env = BFCLMultiTurnEnv("multi_turn_base", split="test")
    env.reset(seed=0)
    for action in actions:
        _, reward, terminated, truncated, _ = env.step(action)
        assert reward in (0.0, 1.0)
        if terminated or truncated:
            break


def test_irrelevance_rewards_no_call_and_penalises_a_call():
    env = BFCLSingleTurnEnv("irrelevance")
    env.reset(options={"index": 0})
    assert env.step("I cannot answer with these functions.")[1] == 1.0
    env.reset(options={"index": 0})
    name = env.task.meta["function"][0]["name"]
    assert env.step(f"[{name}()]")[1] == 0.0


def test_env_expert_follows_the_expert_protocol_and_solves_its_task():
    from trace_gym.experts import Expert

    env = BFCLMultiTurnEnv("multi_turn_long_context", split="test")
    expert = env.expert(noise=0.0, seed=0)
    assert isinstance(expert, Expert)
    _, info = env.reset(seed=1)
    done, reward = False, 0.0
    while not done:
        _, reward, terminated, truncated, info = env.step(expert.act(env.task, info["messages"]))
        done = terminated or truncated
    assert reward == 1.0


def test_without_bfcl_eval_the_env_says_what_to_install(monkeypatch):
    """One line with the fix, from the constructor: not a traceback from the first step."""
    import sys

    from trace_gym.environments.bfcl.backends import BFCL_INSTALL
    from trace_gym.environments.bfcl.env import BFCLMultiTurnEnv, BFCLSingleTurnEnv
    from trace_gym.errors import SetupError

    for name in [m for m in sys.modules if m == "bfcl_eval" or m.startswith("bfcl_eval.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)
    for env in (BFCLMultiTurnEnv, BFCLSingleTurnEnv):
        with pytest.raises(SetupError, match=BFCL_INSTALL.replace(".", r"\.")):
            env()
