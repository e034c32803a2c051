"""The conformance checker's own parts: schema-valid arguments and the calls it writes."""

import jsonschema
import numpy as np
import pytest

from tests.trace_gym.toy_envs import DiceEnv, InventoryEnv
from trace_gym.checker import sample_value, schema_calls

SCHEMAS = [
    {"type": "object", "properties": {"q": {"type": "string", "minLength": 3, "maxLength": 5}}, "required": ["q"],
     "additionalProperties": False},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 2, "maximum": 4},
                                      "x": {"type": "number", "exclusiveMinimum": 1.5, "maximum": 2.0}},
     "required": ["n", "x"]},
    {"type": "object", "properties": {"mode": {"enum": ["a", "b"]}, "flag": {"type": "boolean"},
                                      "k": {"const": 7}, "v": {"type": ["integer", "null"]}}, "required": ["mode"]},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}, "minItems": 2,
                                                "maxItems": 3},
                                      "nested": {"type": "object", "properties": {"a": {"type": "integer"}},
                                                 "required": ["a"]},
                                      "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
     "required": ["items", "nested", "either"]},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_sampled_arguments_are_valid_under_their_schema(schema) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    rng = np.random.default_rng(0)
    for _ in range(200):
        value = sample_value(schema, rng, words=["alpha", "be", "gamma"])
        assert validator.is_valid(value), (value, list(validator.iter_errors(value)))


def test_schema_calls_are_valid_calls_of_the_env_tools() -> None:
    env = DiceEnv()
    env.reset(seed=0)
    for action in schema_calls(env, np.random.default_rng(1), 30):
        parsed = env.parser.parse(action, env.tool_map)
        assert parsed.error is None and len(parsed.calls) == 1
        tool = env.tool_map[parsed.calls[0].name]
        assert tool.validator.is_valid(parsed.calls[0].arguments)


def test_schema_calls_draw_strings_from_the_episode() -> None:
    env = InventoryEnv()
    env.reset(seed=0)
    calls = schema_calls(env, np.random.default_rng(0), 40)
    assert any('"item": "widget"' in c for c in calls)


def test_the_checker_plays_the_expert_and_finds_state_behind_a_valid_argument() -> None:
    from tests.trace_gym.toy_envs import VaultEnv
    from trace_gym.checker import ConformanceError, check_trace_env

    check_trace_env(VaultEnv, skip_gym_check=True)  # the sound vault passes
    with pytest.raises(ConformanceError, match="native restore") as caught:
        check_trace_env(lambda: VaultEnv(leaky=True), skip_gym_check=True)
    assert len(str(caught.value)) < 400 and "the vault" in str(caught.value)


def test_without_an_expert_the_report_says_what_went_unchecked() -> None:
    """What the expert adds: generated codes never open the vault, so its leak cannot show; a pass without an
    expert says that it played schema-generated calls only."""
    from tests.trace_gym.toy_envs import VaultEnv
    from trace_gym.checker import check_trace_env

    class NoExpert(VaultEnv):
        expert = None  # type: ignore[assignment]

    report = check_trace_env(lambda: NoExpert(leaky=True), skip_gym_check=True, quiet=True)
    assert not report.expert and "no expert: schema-generated calls only" in str(report)


def test_a_mismatch_names_the_first_differing_field_and_trims_both_values() -> None:
    from trace_gym.checker import first_difference

    long = "x" * 3000
    want = [{"role": "user", "content": long + "abc" + long}, {"role": "tool", "content": "1"}]
    have = [{"role": "user", "content": long + "abd" + long}, {"role": "tool", "content": "1"}]
    where, a, b = first_difference(want, have, "messages")
    assert where == "messages[0]['content'] (character 3002)"
    assert "abc" in a and "abd" in b and len(a) < 80 and len(b) < 80
    assert first_difference({"k": 1}, {"k": 1, "z": 2}, "info")[0] == "info['z']"
    assert first_difference([1, 2], [1, 2, 3], "messages") == ("len(messages)", "2", "3")


def test_the_checker_takes_a_module_colon_class_spec() -> None:
    from trace_gym.checker import check_trace_env

    check_trace_env("tests.trace_gym.toy_envs:VaultEnv", skip_gym_check=True)


def test_an_env_whose_tool_cannot_run_fails_the_check() -> None:
    # A tool that cannot start its backend is a setup failure: it raises out of step(), so the checker fails
    # instead of passing an env whose every call would read as the model's mistake.
    from tests.trace_gym.toy_envs import DiceEnv
    from trace_gym.checker import check_trace_env

    class BrokenDice(DiceEnv):
        def roll(self, sides: int = 6) -> str:
            """Roll one die on a backend that is not there."""
            raise RuntimeError("the dice backend could not start")

    check_trace_env(DiceEnv, skip_gym_check=True)
    with pytest.raises(RuntimeError, match="could not start"):
        check_trace_env(BrokenDice, skip_gym_check=True)


def test_a_passing_env_says_what_was_checked(capsys) -> None:
    from trace_gym.checker import check_trace_env

    report = check_trace_env("tests.trace_gym.toy_envs:VaultEnv", skip_gym_check=True)
    line = capsys.readouterr().out.strip()
    assert line == str(report) and line.startswith("tests.trace_gym.toy_envs:VaultEnv conforms: ")
    assert "3 scripts of 3 turns" in line and "expert turns" in line and "no process left" in line
    check_trace_env("tests.trace_gym.toy_envs:VaultEnv", skip_gym_check=True, quiet=True)
    assert capsys.readouterr().out == ""


def test_an_env_instance_is_one_line_asking_for_an_id_or_a_factory() -> None:
    from trace_gym.checker import check_trace_env
    from trace_gym.errors import ConfigError

    env = DiceEnv()
    with pytest.raises(ConfigError, match=r"got a DiceEnv instance .*fix: check_trace_env\('my/Env-v0'\)"):
        check_trace_env(env)
    env.close()
