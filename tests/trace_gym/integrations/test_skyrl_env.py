"""A trace-gym env inside skyrl-gym: built by skyrl_gym.make from a dataset row in skyrl-train's form, played with
skyrl-gym's init/step loop to its reward, and branched with snapshot/restore. The env comes from the operator's
env_config only: a row that tries to choose it is refused."""

from __future__ import annotations

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym")
datasets = pytest.importorskip("datasets")

from omegaconf import OmegaConf  # noqa: E402  (skyrl-gym's own dependency; skyrl-train's config type)

from tests.training.parity_env import ENTRY_POINT  # noqa: E402
from trace_gym.errors import ConfigError  # noqa: E402
from trace_gym.integrations.skyrl_env import ENV_CLASS, TraceGymSkyRLEnv, skyrl_rows  # noqa: E402

ARGS = {"n_tasks": 3, "word_fraction": 0.0}


def expert_turn(messages):
    """The Arithmetic expert's next turn from the chat alone (what a policy sees)."""
    if messages[-1]["role"] == "tool":
        return f"<answer>{messages[-1]['content'].strip()}</answer>"
    return f"<python>print({messages[-1]['content'].removeprefix('Compute ').removesuffix('.')})</python>"


def skyrl_train_inputs(path, max_turns=4):
    """What skyrl-train 0.3 hands skyrl_gym.make for each row of a parquet dataset (its PromptDataset pops the
    ``prompt`` and ``env_class`` columns and passes every other column as the extras; its generator sets
    ``extras["max_turns"]`` and takes env_config from the operator's ``environment.skyrl_gym[env_class]``)."""
    table = datasets.load_dataset("parquet", data_files=str(path), keep_in_memory=True)["train"]
    for row in table:
        row = dict(row)
        prompt, env_class = row.pop("prompt"), row.pop("env_class")
        yield prompt, env_class, {**row, "max_turns": max_turns}


def test_skyrl_trains_rows_build_the_env_and_play_it_to_its_reward(tmp_path):
    rows = skyrl_rows("trace/Arithmetic-v0", ARGS)
    assert [sorted(r) for r in rows] == [["data_source", "env_class", "prompt", "reward_spec", "task_id"]] * 3
    datasets.Dataset.from_list(rows).to_parquet(tmp_path / "train.parquet")
    operator = OmegaConf.create({ENV_CLASS: {"env": "trace/Arithmetic-v0", "env_args": ARGS}})
    played = []
    for prompt, env_class, extras in skyrl_train_inputs(tmp_path / "train.parquet"):
        env = skyrl_gym.make(env_class, env_config=operator.get(env_class), extras=extras)
        chat, meta = env.init(prompt)
        assert isinstance(env, TraceGymSkyRLEnv) and meta["task_id"] == extras["task_id"]
        assert chat == prompt  # the env's own first messages, as the row carries them
        done, reward = False, 0.0
        while not done:
            action = expert_turn(chat)
            out = env.step(action)
            chat = [*chat, {"role": "assistant", "content": action}, *out["observations"]]
            done, reward = out["done"], out["reward"]
        assert reward == 1.0 and env.get_metrics() == {"turns": 2, "reward": 1.0}
        played.append(meta["task_id"])
        env.close()
    assert played == [r["task_id"] for r in rows]


def test_rows_carry_their_data_source_and_reward_spec_as_skyrl_train_reads_them(tmp_path):
    from trace_gym.env_specs import make_env

    rows = skyrl_rows("trace/Arithmetic-v0", ARGS)
    env = make_env("trace/Arithmetic-v0", **ARGS)
    golds = {t.id: t.answer for t in env.unwrapped.tasks}
    env.close()
    assert {r["data_source"] for r in rows} == {"trace/Arithmetic-v0"}
    assert [r["reward_spec"] for r in rows] == [{"method": "rule", "ground_truth": str(golds[r["task_id"]])}
                                                for r in rows]
    datasets.Dataset.from_list(rows).to_parquet(tmp_path / "train.parquet")  # one type per column
    _, _, extras = next(skyrl_train_inputs(tmp_path / "train.parquet"))
    assert extras["data_source"] == "trace/Arithmetic-v0" and extras["reward_spec"]["method"] == "rule"


@pytest.mark.parametrize("extras", [{"task_id": "arith-0", "env": ENTRY_POINT},
                                    {"task_id": "arith-0", "env_args": {"data_path": "/etc/shadow"}},
                                    {"env_extras": {"env": ENTRY_POINT, "task_id": "p0-1"}}])
def test_a_row_cannot_choose_the_env_or_its_arguments(extras):
    operator = {"env": "trace/Arithmetic-v0", "env_args": ARGS}
    with pytest.raises(ConfigError, match="pick a task only"):
        skyrl_gym.make(ENV_CLASS, env_config=operator, extras=extras)


def test_an_env_config_without_the_env_says_where_to_set_it():
    with pytest.raises(ConfigError, match=r"environment\.skyrl_gym\.trace-gym\.env"):
        TraceGymSkyRLEnv(OmegaConf.create({}), {"task_id": "arith-0"})


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


def test_a_row_without_a_task_id_says_how_to_build_rows():
    with pytest.raises(ConfigError, match="skyrl_rows"):
        TraceGymSkyRLEnv({"env": "trace/Arithmetic-v0"}, {"prompt": []})


MIXED = {"envs": {"math": {"env": "trace/Arithmetic-v0", "env_args": ARGS},
                  "even": {"env": ENTRY_POINT, "env_args": {"n_tasks": 2}}}}


def test_rows_of_several_operator_envs_each_play_their_own_env(tmp_path):
    rows = skyrl_rows("trace/Arithmetic-v0", ARGS, env_key="math") + skyrl_rows(ENTRY_POINT, {"n_tasks": 2},
                                                                                env_key="even")
    assert [(r["env_key"], r["data_source"]) for r in rows] == [("math", "math")] * 3 + [("even", "even")] * 2
    datasets.Dataset.from_list(rows).to_parquet(tmp_path / "train.parquet")
    operator = OmegaConf.create({ENV_CLASS: MIXED})
    rewards = {}
    for prompt, env_class, extras in skyrl_train_inputs(tmp_path / "train.parquet"):
        env = skyrl_gym.make(env_class, env_config=operator.get(env_class), extras=extras)
        chat, _ = env.init(prompt)
        assert chat == prompt
        if extras["env_key"] == "math":  # the expert's two turns solve Arithmetic
            out = env.step(expert_turn(chat))
            out = env.step(expert_turn([*chat, {"role": "assistant", "content": "x"}, *out["observations"]]))
        else:  # the parity env: any first turn, then an even-length one
            env.step("first")
            out = env.step("even")
        rewards[(extras["env_key"], extras["task_id"])] = out["reward"]
        env.close()
    assert rewards == {**{("math", r["task_id"]): 1.0 for r in rows[:3]}, ("even", "p0-0"): 1.0, ("even", "p0-1"): 1.0}


@pytest.mark.parametrize("key", ["other", ENTRY_POINT, "../math", None, {"env": ENTRY_POINT}])
def test_a_row_names_only_a_key_of_the_operators_envs(key):
    extras = {"task_id": "arith-0", **({"env_key": key} if key is not None else {})}
    with pytest.raises(ConfigError, match="one of the operator's envs"):
        skyrl_gym.make(ENV_CLASS, env_config=MIXED, extras=extras)


def test_a_row_cannot_bring_envs_of_its_own():
    with pytest.raises(ConfigError, match="pick a task only"):
        skyrl_gym.make(ENV_CLASS, env_config=MIXED, extras={"task_id": "p0-0", "env_key": "even", "envs": {
            "even": {"env": "trace/Arithmetic-v0", "env_args": {"data_path": "/etc/shadow"}}}})
    with pytest.raises(ConfigError, match="no env_key in a row of a single-env"):
        skyrl_gym.make(ENV_CLASS, env_config={"env": "trace/Arithmetic-v0", "env_args": ARGS},
                       extras={"task_id": "arith-0", "env_key": "math"})
    with pytest.raises(ConfigError, match=r"envs: .* alone"):
        skyrl_gym.make(ENV_CLASS, env_config={**MIXED, "env": ENTRY_POINT},
                       extras={"task_id": "p0-0", "env_key": "even"})
    with pytest.raises(ConfigError, match="env key of letters"):
        skyrl_rows(ENTRY_POINT, {"n_tasks": 1}, env_key="a/b")
