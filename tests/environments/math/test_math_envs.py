"""Math envs: conformance on every variant, the scripted experts, parsing formats, data loading."""

import json
from pathlib import Path

import gymnasium as gym
import pytest

from trace_gym.checker import check_trace_env
from trace_gym.environments.math.arithmetic import ArithmeticConfig, make_tasks
from trace_gym.environments.math.env import DATASETS, ArithmeticEnv, MathEnv, load_math_tasks, python_call
from trace_gym.environments.sandbox.host import start_template
from trace_gym.errors import ConfigError, DataError


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


def test_a_guessing_expert_answers_without_the_tool_in_its_share_of_episodes() -> None:
    env = ArithmeticEnv(difficulty=2, n_tasks=64)
    expert = env.expert(guess=0.5, seed=3)
    firsts = [expert.act(task, [{"role": "user", "content": task.prompt}]) for task in env.unwrapped.tasks]
    guesses = [a for a in firsts if a.startswith("<answer>")]
    assert 16 <= len(guesses) <= 48 and all("<python>" in a for a in firsts if a not in guesses)
    # a guess is the gold answer: the expert's episodes still all succeed, in one turn instead of two
    for i in range(6):
        _, info = env.reset(seed=i)
        assert _play(env, env.expert(guess=1.0, seed=i), info) == 1
        assert env.unwrapped.turn_count == 1
    env.close()


def test_guessing_is_limited_to_the_named_tiers() -> None:
    tiers = {"easy": {"share": 0.5, "max_ops": 1, "min_ops": 1}, "hard": {"share": 0.5, "min_ops": 4, "max_ops": 4}}
    env = ArithmeticEnv(tiers=tiers, n_tasks=40)
    expert = env.expert(guess=1.0, guess_tiers=["easy"])
    for task in env.unwrapped.tasks:
        first = expert.act(task, [{"role": "user", "content": task.prompt}])
        assert first.startswith("<answer>") == (task.meta["tier"] == "easy")
    env.close()
    with pytest.raises(ConfigError, match="guess"):
        env.expert(guess=1.5)


def test_tiers_hold_their_shares_and_settings_exactly() -> None:
    tiers = {"one": {"share": 0.3, "min_ops": 1, "max_ops": 1, "max_digits": 1},
             "five": {"share": 0.7, "min_ops": 5, "max_ops": 5, "min_digits": 3}}
    env = gym.make("trace/Arithmetic-v0", tiers=tiers, n_tasks=50, word_fraction=0.0)
    tasks = env.unwrapped.tasks
    env.close()
    by = {name: [t for t in tasks if t.meta["tier"] == name] for name in tiers}
    assert (len(by["one"]), len(by["five"])) == (15, 35)
    assert {t.meta["ops"] for t in by["one"]} == {1} and {t.meta["ops"] for t in by["five"]} == {5}
    assert all(str(eval(t.meta["expression"])) == t.answer for t in tasks)
    assert [t.meta["tier"] for t in tasks] != sorted(t.meta["tier"] for t in tasks)  # shuffled, not in blocks
    assert len({t.id for t in tasks}) == 50


@pytest.mark.parametrize("tiers, match", [({"a": {"max_ops": 1}}, "share"), ({"a": {"share": 1, "ops": 2}}, "ops"),
                                          ({}, "at least one tier"), ({"a": {"share": 0}}, "share > 0")])
def test_bad_tiers_raise_with_a_fix(tiers, match) -> None:
    with pytest.raises(ConfigError, match=match):
        ArithmeticEnv(tiers=tiers)


def test_variables_persist_across_turns_in_an_episode() -> None:
    env = MathEnv(dataset="aime24", action_format="tags")
    env.reset(seed=0)
    env.step("<python>n = 12</python>")
    obs, *_ = env.step("<python>print(n * 2)</python>")
    assert obs == "24\n"
    env.close()


def test_new_episode_starts_with_a_fresh_namespace() -> None:
    env = MathEnv(dataset="aime24", action_format="tags")
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


# ----------------------------------------------------------------- data as users have it
def test_prompt_answer_records_load_as_aime_2025_ships_them(tmp_path) -> None:
    path = tmp_path / "aime25.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(3)))
    tasks = load_math_tasks("aime24", data_path=path)
    assert [(t.prompt, t.answer) for t in tasks] == [(f"What is {i} + 1?", str(i + 1)) for i in range(3)]


def test_fields_map_other_column_names(tmp_path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([{"statement": "2*3?", "solution_value": 6, "key": "p1"}]))
    task = load_math_tasks("aime24", data_path=path, fields={"problem": "statement", "answer": "solution_value",
                                                            "id": "key"})[0]
    assert (task.id, task.prompt, task.answer) == ("p1", "2*3?", "6")


def test_an_unknown_layout_names_the_file_and_says_how_to_map_it(tmp_path) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"statement": "2*3?", "value": 6}) + "\n")
    with pytest.raises(DataError, match=r"odd\.jsonl record 0.*fix: pass fields="):
        load_math_tasks("aime24", data_path=path)


@pytest.mark.parametrize(("content", "match"), [(None, "no such file"), ("{not json", "parse error on line 1")])
def test_missing_or_malformed_data_path_raises_a_data_error_naming_the_file(tmp_path, content, match) -> None:
    path = tmp_path / "problems.json"
    if content is not None:
        path.write_text(content)
    env = MathEnv(data_path=path)
    with pytest.raises(DataError, match=rf"{match}.*") as err:
        env.reset(seed=0)
    assert str(path) in str(err.value) and "fix:" in str(err.value)
    env.close()


def test_tasks_from_a_datasets_dataset_with_a_column_mapping() -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"query": ["1+1?", "2+2?"], "target": ["2", "4"]})
    env = MathEnv(data_path=ds, fields={"problem": "query", "answer": "target"})
    env.reset(options={"index": 1})
    assert env.task.prompt == "2+2?" and env.task.answer == "4"
    env.close()


# ----------------------------------------------------------------- formats
def test_math_envs_default_to_hermes_and_arithmetic_to_tags() -> None:
    math_env, arithmetic = MathEnv(dataset="aime24"), ArithmeticEnv(difficulty=1)
    assert (math_env.action_format, arithmetic.action_format) == ("hermes", "tags")
    _, info = math_env.reset(seed=0)
    assert "<tool_call>" in info["messages"][0]["content"] and "\\boxed" in info["messages"][0]["content"]
    math_env.close()
    arithmetic.close()


def test_a_qwen_style_call_on_arithmetics_tag_format_is_told_that_action_format_hermes_exists() -> None:
    env = ArithmeticEnv(difficulty=1)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step('<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}'
                                                "</tool_call>")
    assert (reward, terminated) == (0.0, False) and "action_format=hermes" in info["error"] and obs.startswith("Error")
    env.close()


def test_a_final_turn_that_only_writes_boxed_is_the_answer_where_the_prompt_asks_for_it() -> None:
    env = MathEnv(dataset="gsm8k")
    env.reset(options={"index": 0})
    gold = env.task.answer
    _, reward, terminated, _, info = env.step(f"So the total is \\boxed{{{gold}}}.")
    assert (reward, terminated, info["answer"], info["stop_reason"]) == (1.0, True, gold, "answer")
    env.close()


def test_boxed_inside_a_tool_call_turn_is_not_an_answer() -> None:
    env = MathEnv(dataset="gsm8k")
    env.reset(options={"index": 0})
    action = env.parser.format(python_call("print(r'\\boxed{1}')"))
    obs, reward, terminated, _, _ = env.step(action)
    assert (obs, reward, terminated) == ("\\boxed{1}\n", 0.0, False)
    env.close()


def test_arithmetic_prompt_asks_for_answer_tags_so_boxed_is_an_error() -> None:
    env = ArithmeticEnv(difficulty=1)
    env.reset(seed=0)
    obs, reward, terminated, *_ = env.step(f"\\boxed{{{env.task.answer}}}")
    assert obs.startswith("Error:") and (reward, terminated) == (0.0, False)
    env.close()


def test_quickstart_trains_arithmetic_in_the_tag_format() -> None:
    """configs/quickstart.yaml gives no action_format: the tiny model's format is the Arithmetic default."""
    import yaml

    config = yaml.safe_load((Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml").read_text())
    assert config["env"]["id"] == "trace/Arithmetic-v0"
    kwargs = {**config["env"]["kwargs"], "n_tasks": 5}
    env = gym.make("trace/Arithmetic-v0", **kwargs).unwrapped
    assert env.action_format == kwargs.get("action_format", "tags") == "tags"
    env.close()
