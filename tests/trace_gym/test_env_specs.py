"""Env specs: a registered id, gymnasium's module:id and module:Class, each with a user's env module written
to the test's folder and found from the working directory, as the `trace-gym` command finds it."""

from __future__ import annotations

import pickle
import sys
import textwrap

import gymnasium as gym
import pytest

from trace_gym.env_specs import EnvFactory, env_factory, make_env, resolve_env_spec
from trace_gym.errors import ConfigError

MODULE = '''
import gymnasium as gym
from trace_gym import Task
from trace_gym import Tool
from trace_gym import ToolEnv


class EchoEnv(ToolEnv):
    """Answer with the word in the prompt."""

    def __init__(self, words=("alpha", "beta"), **kwargs):
        self.words = list(words)
        super().__init__(**kwargs)

    def load_tasks(self):
        return [Task(id=w, prompt=f"Say {w}.", answer=w) for w in self.words]

    def tools(self):
        return [Tool.from_function(self.shout)]

    def shout(self, word: str) -> str:
        """Shout a word."""
        return word.upper()

    def verify(self, task, answer):
        return float(answer.strip() == task.answer), {}


class BrokenEnv(EchoEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        sorted([1], reverse=1, bogus=2)  # a bug inside the constructor: a TypeError of its own


NOT_AN_ENV = 3

gym.register("ENV_ID", entry_point=EchoEnv, kwargs={"words": ["gamma"]})
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch, request):
    """A fresh env module in the working directory (a new name per test: modules are cached per process)."""
    name = f"user_envs_{request.node.name.replace('[', '_').replace(']', '_').replace('-', '_')}"
    env_id = f"user/{name}-v0"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE.replace("ENV_ID", env_id)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield name, env_id
    sys.modules.pop(name, None)
    gym.registry.pop(env_id, None)


def _play(env: gym.Env, answer: str) -> float:
    env.reset(options={"index": 0})
    _, reward, terminated, _, _ = env.step(f"<answer>{answer}</answer>")
    assert terminated
    return reward


def test_a_registered_id_makes_its_env():
    env = env_factory("trace/Arithmetic-v0", {"n_tasks": 3})()
    assert len(env.unwrapped.tasks) == 3
    env.close()


def test_module_colon_class_makes_the_class_from_the_working_directory(user_module):
    name, _ = user_module
    env = env_factory(f"{name}:EchoEnv", {"words": ["delta"]})()
    assert type(env.unwrapped).__name__ == "EchoEnv" and _play(env, "delta") == 1.0


def test_module_colon_id_imports_the_module_that_registers_the_id(user_module):
    name, env_id = user_module
    env = make_env(f"{name}:{env_id}")
    assert [t.id for t in env.unwrapped.tasks] == ["gamma"] and _play(env, "gamma") == 1.0


def test_an_unknown_id_suggests_the_nearest():
    with pytest.raises(ConfigError, match="did you mean 'trace/Arithmetic-v0'"):
        resolve_env_spec("trace/Arithmatic-v0")


def test_an_unknown_id_far_from_any_lists_the_trace_ids():
    with pytest.raises(ConfigError, match="trace/HotpotQA-v0") as err:
        resolve_env_spec("zzzzzz")
    assert "module:Class" in str(err.value)


def test_a_missing_module_says_where_it_is_looked_for(user_module):
    with pytest.raises(ConfigError, match="PYTHONPATH"):
        resolve_env_spec("no_such_module_here:Env")


def test_a_missing_class_names_the_classes_of_the_module(user_module):
    name, _ = user_module
    with pytest.raises(ConfigError, match=f"did you mean {name}:EchoEnv"):
        resolve_env_spec(f"{name}:EchoEnvv")


def test_an_attribute_that_is_not_callable_is_refused(user_module):
    name, _ = user_module
    with pytest.raises(ConfigError, match="class or a function"):
        resolve_env_spec(f"{name}:NOT_AN_ENV")


def test_a_misspelt_keyword_argument_suggests_the_one_the_env_takes(user_module):
    name, _ = user_module
    with pytest.raises(ConfigError, match="did you mean words"):
        make_env(f"{name}:EchoEnv", wordz=["x"])


def test_a_keyword_argument_of_a_registered_env_is_checked_too():
    with pytest.raises(ConfigError, match="did you mean n_tasks"):
        make_env("trace/Arithmetic-v0", n_taks=3)


def test_the_did_you_mean_suggests_only_a_keyword_that_takes_the_value():
    """HotpotQA's nearest keyword to n_tasks is tasks, a sequence of Task objects: an integer cannot go there, so
    the fix says how each command plays fewer tasks instead (sft has no --tasks); a string keyword still gets its
    suggestion."""
    with pytest.raises(ConfigError) as caught:
        make_env("trace/HotpotQA-v0", n_tasks=3)
    fix = str(caught.value).split("fix: ", 1)[1]
    assert "did you mean" not in fix
    assert all(flag in fix for flag in ("eval and rollout: --tasks N", "vf-validate: -n N", "sft: --episodes N"))
    with pytest.raises(ConfigError, match="did you mean action_format"):
        make_env("trace/HotpotQA-v0", actionformat="tags")
    with pytest.raises(ConfigError, match="did you mean top_k"):
        make_env("trace/HotpotQA-v0", top_kk=2)


def test_a_type_error_inside_the_constructor_keeps_its_traceback(user_module):
    name, _ = user_module
    with pytest.raises(TypeError, match="bogus"):
        make_env(f"{name}:BrokenEnv")


def test_the_factory_names_the_class_of_every_form_without_building_an_env(user_module):
    name, env_id = user_module
    specs = {f"{name}:EchoEnv": "EchoEnv", f"{name}:{env_id}": "EchoEnv", "trace/Arithmetic-v0": "ArithmeticEnv",
             f"{name}:BrokenEnv": "BrokenEnv"}  # BrokenEnv's constructor raises: no env is built
    assert {spec: env_factory(spec).env_class.__name__ for spec in specs} == specs
    assert EnvFactory.of(lambda: make_env(f"{name}:EchoEnv")).env_class is None  # a callable names no class


def test_the_factory_answers_tasks_and_says_when_there_is_no_expert(user_module):
    name, env_id = user_module
    factory = env_factory(f"{name}:{env_id}")
    assert [t.id for t in factory.tasks()] == ["gamma"] and not factory.has_expert
    with pytest.raises(ConfigError, match="fix: use a model policy"):
        factory.expert()
    factory.close()


def test_a_factory_pickles_and_makes_the_env_after_unpickling(user_module):
    name, _ = user_module
    factory = pickle.loads(pickle.dumps(env_factory(f"{name}:EchoEnv", {"words": ["eps"]})))
    assert isinstance(factory, EnvFactory) and [t.id for t in factory().unwrapped.tasks] == ["eps"]


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"max_turns": "four"}, "expected max_turns of trace/Arithmetic-v0 to be an integer, got 'four'"),
    ({"word_fraction": "half"}, "to be a number or None, got 'half'"),
    ({"action_format": "json"}, "to be one of 'tags', 'hermes', got 'json'"),
])
def test_a_value_of_the_wrong_type_is_refused_before_the_env_is_built(kwargs, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        make_env("trace/Arithmetic-v0", **kwargs)


def test_values_of_the_annotated_types_pass(user_module):
    env = make_env("trace/Arithmetic-v0", n_tasks=3, max_turns=2, word_fraction=1, action_format="hermes")
    try:
        assert env.unwrapped.max_turns == 2 and env.unwrapped.config.word_fraction == 1
    finally:
        env.close()


def test_data_settings_that_arithmetic_would_drop_are_refused():
    with pytest.raises(ConfigError, match="expected no data_path for trace/Arithmetic-v0"):
        make_env("trace/Arithmetic-v0", data_path="/nope.jsonl")


def test_every_env_string_goes_through_the_resolver():
    """No library module calls gym.make itself (it knows neither module:Class nor the keyword checks)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    calls = []
    for folder in ("trace_gym", "training", "agents", "environments", "benchmarks"):
        for path in (root / folder).rglob("*.py"):
            if path.name == "env_specs.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr == "make" and isinstance(node.value, ast.Name) \
                        and node.value.id in ("gym", "gymnasium"):
                    calls.append(f"{path.relative_to(root)}:{node.lineno}")
    assert calls == [], f"gym.make outside trace_gym/env_specs.py: {calls}; use make_env or env_factory"
