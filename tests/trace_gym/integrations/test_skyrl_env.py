"""A trace-gym env inside skyrl-gym: built by skyrl_gym.make from a dataset row, played with skyrl-gym's
init/step loop to its reward, and branched with snapshot/restore."""

from __future__ import annotations

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym")

from tests.training.parity_env import ENTRY_POINT  # noqa: E402
from trace_gym.integrations.skyrl_env import ENV_CLASS, TraceGymSkyRLEnv, skyrl_rows  # noqa: E402


def expert_turn(messages):
    """The Arithmetic expert's next turn from the chat alone (what a policy sees)."""
    if messages[-1]["role"] == "tool":
        return f"<answer>{messages[-1]['content'].strip()}</answer>"
    return f"<python>print({messages[-1]['content'].removeprefix('Compute ').removesuffix('.')})</python>"


def test_a_skyrl_gym_loop_plays_a_trace_gym_env_to_its_reward():
    rows = skyrl_rows("trace/Arithmetic-v0", {"n_tasks": 3, "word_fraction": 0.0})
    assert [r["env_class"] for r in rows] == [ENV_CLASS] * 3
    for row in rows:
        env = skyrl_gym.make(row["env_class"], env_config={}, extras=row["env_extras"])
        chat, meta = env.init(row["prompt"])
        assert isinstance(env, TraceGymSkyRLEnv) and meta["task_id"] == row["env_extras"]["task_id"]
        done, reward = False, 0.0
        while not done:
            action = expert_turn(chat)
            out = env.step(action)
            chat = [*chat, {"role": "assistant", "content": action}, *out["observations"]]
            done, reward = out["done"], out["reward"]
        assert reward == 1.0 and env.get_metrics() == {"turns": 2, "reward": 1.0}
        env.close()


def test_a_skyrl_env_branches_from_a_snapshot():
    env = skyrl_gym.make(ENV_CLASS, env_config={"env": ENTRY_POINT, "env_args": {"n_tasks": 2}},
                         extras={"task_id": "p0-1"})
    env.init()
    assert env.step("first")["observations"][0]["content"].startswith("noted")
    handle = env.snapshot()
    assert env.step("even")["reward"] == 1.0
    env.restore(handle)
    assert env.turns == 1 and env.step("odd")["reward"] == 0.0
    env.close()


def test_a_row_without_an_env_says_how_to_build_rows():
    with pytest.raises(Exception, match="skyrl_rows"):
        TraceGymSkyRLEnv({}, {"task_id": "x"})
