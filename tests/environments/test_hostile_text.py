"""Model text from the attacker's side, on every registered env id: whatever the size, nesting or number of calls
of an action, ``step`` returns an observation in the observation space (an error observation when the action is
malformed), never raises, and the env goes on to play a normal action."""

from __future__ import annotations

import math
from collections.abc import Iterator

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trace_gym.env import TextEnv
from trace_gym.env_specs import make_env
from trace_gym.registration import trace_env_ids

BIG = "9" * 5000  # past Python's 4,300-digit limit for int <-> str


def hostile_actions(tool: str, param: str, max_chars: int) -> dict[str, str]:
    """Actions an attacker writes against a tool ``tool`` with a parameter ``param``, each at most ``max_chars + 1``
    characters (the one past the limit)."""
    call = f'<tool_call>{{"name": "{tool}", "arguments": {{"{param}": "x"}}}}</tool_call>'
    python_call = f"{tool}({param}='x')"
    deep = (max_chars - 200) // 2
    return {
        "json integer of 5000 digits": f'<tool_call>{{"name": "{tool}", "arguments": {{"{param}": {BIG}}}}}'
                                       "</tool_call>",
        "json string arguments with such an integer": f'<tool_call>{{"name": "{tool}", "arguments": '
                                                      f'"{{\\"{param}\\": {BIG}}}"}}</tool_call>',
        "json arguments nested 500 deep": f'<tool_call>{{"name": "{tool}", "arguments": {{"{param}": '
                                          f'{"[" * 500}{"]" * 500}}}}}</tool_call>',
        "json arguments nested as deep as the action allows": f'<tool_call>{{"name": "{tool}", "arguments": '
                                                              f'{{"{param}": {"[" * deep}{"]" * deep}}}}}</tool_call>',
        "python call nested 500 deep": f"[{tool}({param}={'[' * 500}{']' * 500})]",
        "python call nested 90 deep": f"[{tool}({param}={'[' * 90}{']' * 90})]",
        "python hex integer of 24000 digits": f"[{tool}({param}=0x{'f' * 20000})]",
        "python positional hex integer": f"[{tool}(0x{'f' * 20000})]",
        "as many json calls as fit": call * (max_chars // len(call)),
        "as many python calls as fit": "[" + ", ".join([python_call] * (max_chars // (len(python_call) + 2))) + "]",
        "as many tag calls as fit": f"<{tool}>x</{tool}>" * (max_chars // (2 * len(tool) + 6)),
        "the longest action": "x" * max_chars,
        "one character past the longest": "x" * (max_chars + 1),
        "surrogates and NULs": f'<tool_call>{{"name": "{tool}", "arguments": {{"{param}": "\\ud800\\u0000"}}}}'
                               "</tool_call>\ud800\x00",
        "an empty tool name after a call": call + '<tool_call>{"name": "", "arguments": {}}</tool_call>',
        "an answer of 5000 digits": f"<answer>{BIG}</answer>",
        "an answer of nested braces": "<answer>" + "{" * (max_chars - 20) + "</answer>",
        "a boxed answer nested deep": "\\boxed{" * (max_chars // 8) + "}" * (max_chars // 8),
        "every tag left open": "<tool_call><answer><python><search>" * (max_chars // 40),
    }


@pytest.fixture(scope="module")
def envs() -> Iterator[dict[str, gym.Env]]:
    made: dict[str, gym.Env] = {}
    yield made
    for env in made.values():
        env.close()


def _env(envs: dict[str, gym.Env], env_id: str) -> gym.Env:
    if env_id not in envs:
        envs[env_id] = make_env(env_id)
    return envs[env_id]


def _target(info: dict) -> tuple[str, str]:
    """The first declared tool and its first parameter (what an attacker reads off the tool schemas)."""
    function = info["tools"][0]["function"]
    return function["name"], next(iter(function["parameters"].get("properties", {})), "x")


def _check_step(env: gym.Env, action: str) -> bool:
    """Step ``action``; assert the outcome is well-formed; True when the episode ended."""
    obs, reward, terminated, truncated, info = env.step(action)
    assert env.observation_space.contains(obs), len(obs)
    assert isinstance(reward, float) and math.isfinite(reward) and 0.0 <= reward <= 1.0
    assert isinstance(terminated, bool) and isinstance(truncated, bool) and isinstance(info, dict)
    if obs.startswith("Error"):
        assert info.get("error")
    return terminated or truncated


def _plays_on(env: gym.Env, ended: bool) -> None:
    """The env is not wedged: it plays one of its own example actions, then starts a new episode."""
    base = env.unwrapped
    assert isinstance(base, TextEnv)
    if not ended:
        _check_step(env, (base.example_actions() or ["<answer>0</answer>"])[0])
    env.reset(seed=1)


CASES = list(hostile_actions("t", "p", 100))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("env_id", trace_env_ids())
def test_a_hostile_action_gets_an_observation(envs: dict[str, gym.Env], env_id: str, case: str) -> None:
    env = _env(envs, env_id)
    _, info = env.reset(seed=0)
    base = env.unwrapped
    assert isinstance(base, TextEnv)
    action = hostile_actions(*_target(info), base.max_action_chars)[case]
    _plays_on(env, _check_step(env, action))


@pytest.mark.parametrize("env_id", trace_env_ids())
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_sequences_of_hostile_pieces_never_raise(envs: dict[str, gym.Env], env_id: str, data: st.DataObject) -> None:
    env = _env(envs, env_id)
    _, info = env.reset(seed=0)
    base = env.unwrapped
    assert isinstance(base, TextEnv)
    pieces = list(hostile_actions(*_target(info), 400).values())
    piece = st.one_of(st.sampled_from(pieces), st.text(max_size=50))
    actions = data.draw(st.lists(st.lists(piece, min_size=1, max_size=4).map("".join), min_size=1, max_size=4))
    ended = False
    for action in actions:
        if _check_step(env, action):
            ended = True
            break
    _plays_on(env, ended)
