"""Math envs: conformance on every variant, the scripted experts, parsing formats, data loading."""

import json

import gymnasium as gym
import pytest

from trace_gym.checker import check_trace_env
from trace_gym.environments.arithmetic import ArithmeticConfig, make_tasks
from trace_gym.environments.math_envs import DATASETS, ArithmeticEnv, MathEnv, load_math_tasks
from trace_gym.environments.sandbox import start_template
from trace_gym.errors import ConfigError


@pytest.fixture(scope="module", autouse=True)
def template() -> None:
    start_template()  # the per-process template outlives envs by design; leak checks must not count it


@pytest.mark.parametrize("dataset", ["deepscaler", "gsm8k", "math500", "aime24", "amc23"])
def test_real_dataset_envs_pass_the_conformance_checker(dataset: str) -> None:
    check_trace_env(lambda: MathEnv(dataset=dataset), depth=2, branches=2)


@pytest.mark.parametrize("action_format", ["tags", "hermes"])
def test_arithmetic_env_passes_the_conformance_checker(action_format: str) -> None:
    check_trace_env(lambda: ArithmeticEnv(difficulty=3, action_format=action_format))


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_bundled_data_loads_with_unique_ids_and_answers(dataset: str) -> None:
    tasks = load_math_tasks(dataset)
    assert len({t.id for t in tasks}) == len(tasks) > 0
    assert all(isinstance(t.answer, str) and t.answer for t in tasks)


@pytest.mark.parametrize("action_format", ["tags", "hermes"])
@pytest.mark.parametrize("dataset", ["gsm8k", "math500", "aime24", "amc23"])
def test_noiseless_expert_solves_real_tasks(dataset: str, action_format: str) -> None:
    env = MathEnv(dataset=dataset, action_format=action_format)
    expert = env.expert(noise=0.0)
    for index in range(3):
        _, info = env.reset(seed=index, options={"index": index * 7})
        reward = _play(env, expert, info)
        assert reward == 1.0, (env.task, info)
    env.close()


def test_arithmetic_expert_noise_lowers_success() -> None:
    env = ArithmeticEnv(difficulty=2)
    rates = []
    for noise in (0.0, 1.0):
        expert = env.expert(noise=noise, seed=1)
        wins = 0
        for i in range(8):
            _, info = env.reset(seed=i)
            wins += _play(env, expert, info)
        rates.append(wins / 8)
    env.close()
    assert rates == [1.0, 0.0]


def test_variables_persist_across_turns_in_an_episode() -> None:
    env = MathEnv(dataset="aime24")
    env.reset(seed=0)
    env.step("<python>n = 12</python>")
    obs, *_ = env.step("<python>print(n * 2)</python>")
    assert obs == "24\n"
    env.close()


def test_new_episode_starts_with_a_fresh_namespace() -> None:
    env = MathEnv(dataset="aime24")
    env.reset(seed=0)
    env.step("<python>n = 12</python>")
    env.reset(seed=1)
    obs, *_ = env.step("<python>print('n' in dir())</python>")
    assert obs == "False\n"
    env.close()


def test_user_data_file_in_a_dataset_format(tmp_path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"question": "1+1?", "answer": "so 2\n#### 2"}) + "\n")
    env = MathEnv(dataset="gsm8k", data_path=path)
    env.reset(seed=0)
    assert env.task.answer == "2"
    _, reward, terminated, _, _ = env.step("<answer>\\boxed{2}</answer>")
    assert reward == 1.0 and terminated
    env.close()


def test_arithmetic_difficulty_controls_operator_count() -> None:
    easy = make_tasks(50, ArithmeticConfig.level(1), seed=0)
    hard = make_tasks(50, ArithmeticConfig.level(5), seed=0)
    assert {t.meta["ops"] for t in easy} == {1} and {t.meta["ops"] for t in hard} == {4}
    assert all(str(eval(t.meta["expression"])) == t.answer for t in easy + hard)


def test_arithmetic_config_from_a_mapping_as_yaml_gives_it() -> None:
    env = gym.make("trace/Arithmetic-v0", config={"min_ops": 5, "max_ops": 5, "word_fraction": 0.0}, n_tasks=20)
    try:
        env.reset(seed=0)
        assert {t.meta["ops"] for t in env.unwrapped.tasks} == {5}
    finally:
        env.close()
    with pytest.raises(ConfigError, match="max_op"):
        ArithmeticEnv(config={"max_op": 5})


def test_bad_configuration_raises_with_a_fix() -> None:
    with pytest.raises(ConfigError):
        MathEnv(dataset="nope")
    with pytest.raises(ConfigError):
        MathEnv(action_format="xml")
    with pytest.raises(ConfigError):
        ArithmeticConfig(min_ops=3, max_ops=2)


def _play(env, expert, info) -> float:
    for _ in range(env.max_turns):
        _, reward, terminated, truncated, info = env.step(expert.act(env.task, info["messages"]))
        if terminated or truncated:
            return reward
    return 0.0
