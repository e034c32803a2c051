"""trace/ArithmeticChain-v0: the two-operator calculator (from the attacker's side too), the generated chains, the
scripted expert and its habit, and the env contract."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import trace_gym  # noqa: F401 - registers the trace/* ids
from trace_gym.checker import check_trace_env
from trace_gym.environments.math.chain import (
    MAX_CALC_CHARS,
    ChainConfig,
    ChainEnv,
    calc,
    calc_value,
    make_chain_tasks,
    read_integer,
)
from trace_gym.errors import ConfigError, ToolError

TIERS = {"short": {"share": 0.5, "min_steps": 2, "max_steps": 2},
         "long": {"share": 0.5, "min_steps": 4, "max_steps": 4, "max_digits": 2, "max_value": 999}}


def play(env: ChainEnv, expert, info: dict) -> tuple[float, int]:
    """The expert plays the episode on from ``info``'s chat; (reward, calls made)."""
    reward, calls = 0.0, 0
    while not env.done:
        _, reward, _, _, info = env.step(expert.act(env.task, info["messages"]))
        calls += int(info.get("tool_calls", 0))
    return reward, calls


@pytest.mark.parametrize("action_format", ["tags", "hermes"])
def test_chain_env_passes_the_conformance_checker(action_format: str) -> None:
    check_trace_env(lambda: ChainEnv(tiers=TIERS, n_tasks=20, action_format=action_format))


def test_registered_id_builds_the_env_with_its_settings() -> None:
    env = gym.make("trace/ArithmeticChain-v0", config={"min_steps": 3, "max_steps": 3}, n_tasks=10)
    assert all(t.meta["steps"] == 3 for t in env.unwrapped.tasks)
    obs, info = env.reset(seed=0)
    assert obs.endswith("Find c.") and info["tools"][0]["function"]["name"] == "calc"
    env.close()


@pytest.mark.parametrize("action_format", ["tags", "hermes"])
def test_the_noiseless_expert_solves_every_chain_with_one_call_per_statement(action_format: str) -> None:
    env = ChainEnv(tiers=TIERS, n_tasks=40, action_format=action_format)
    for i, task in enumerate(env.tasks):
        _, info = env.reset(options={"task": task})
        assert play(env, env.expert(seed=i), info) == (1.0, task.meta["steps"])
    env.close()


def test_generated_statements_hold_their_values_and_bounds() -> None:
    cfg = ChainConfig(min_steps=3, max_steps=5, max_digits=2, max_value=500)
    for task in make_chain_tasks(200, cfg, seed=3):
        statements = task.meta["statements"]
        assert 3 <= len(statements) <= 5 and task.answer == str(statements[-1][2])
        prev = None
        for k, (name, rhs, value) in enumerate(statements):
            assert name == "abcdefgh"[k] and abs(value) <= 500
            if k:  # the previous name comes first; substituted, the statement has the stated value
                assert rhs.startswith("abcdefgh"[k - 1])
                rhs = str(prev) + rhs[1:]
            assert calc_value(rhs) == value
            prev = value
        assert task.prompt == ", ".join(f"{n}={r}" for n, r, _ in statements) + f". Find {statements[-1][0]}."
    assert make_chain_tasks(5, cfg, seed=3) == make_chain_tasks(5, cfg, seed=3)


def test_tiers_hold_their_shares_and_settings() -> None:
    tasks = ChainEnv(tiers=TIERS, n_tasks=50).tasks
    by = {name: [t for t in tasks if t.meta["tier"] == name] for name in TIERS}
    assert (len(by["short"]), len(by["long"])) == (25, 25)
    assert {t.meta["steps"] for t in by["short"]} == {2} and {t.meta["steps"] for t in by["long"]} == {4}


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=3), st.lists(st.sampled_from("+-*"), max_size=2),
       st.booleans())
def test_calc_agrees_with_integer_arithmetic(numbers: list[int], ops: list[str], parens: bool) -> None:
    n = min(len(numbers), len(ops) + 1)
    terms, ops = [str(x) for x in numbers[:n]], ops[: n - 1]
    text = terms[0] + "".join(f" {op} {t}" for op, t in zip(ops, terms[1:]))
    if parens and ops:
        text = f"({terms[0]} {ops[0]} {terms[1]})" + "".join(f" {op} {t}" for op, t in zip(ops[1:], terms[2:]))
    expected = eval(text, {"__builtins__": {}})  # the test's own digits and + - * only
    assert calc_value(text) == expected
    assert calc(f"b = {text}") == f"b={expected}"


@pytest.mark.parametrize("text, match", [
    ("1+2+3+4", "at most 2 operators"), ("a+1", "'a' is a name"), ("__import__('os')", "is a name"),
    ("2**3", "found '\\*'"), ("3/4", "unexpected character '/'"), ("(1+2", "unbalanced"), ("1+2)", "unexpected '\\)'"),
    ("1+", "ends too early"), ("", "empty expression"), ("9" * 31, "31 digits"), ("(" * 9 + "1" + ")" * 9, "nested"),
    ("-" * 9 + "1", "nested"), ("1" * (MAX_CALC_CHARS + 1), "characters is over"), ("b==3", "is a name"),
])
def test_calc_refuses_what_it_does_not_take_with_a_message_for_the_model(text: str, match: str) -> None:
    with pytest.raises(ToolError, match=match):
        calc(text)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789+-*()= abx_/.\n\x00é")), max_size=250))
def test_any_text_gets_a_value_or_a_tool_error(text: str) -> None:
    try:
        out = calc(text)
    except ToolError:
        return
    assert len(out) < 300  # two operators on 30-digit literals: at most ~90 digits


def test_hostile_calls_are_error_observations_and_the_episode_goes_on() -> None:
    env = ChainEnv(n_tasks=5)
    env.reset(seed=0)
    for action in ["<calc>" + "(" * 5000 + "</calc>", "<calc>" + "9" * 5000 + "*9</calc>", "<calc>a+1</calc>",
                   "<calc>1+1+1+1</calc>"]:
        obs, reward, terminated, _, info = env.step(action)
        assert obs.startswith("Error: calc failed") and reward == 0.0 and not terminated and "error" in info
    obs, *_ = env.step("<calc>x=2*(3-8)</calc>")
    assert obs == "x=-10"
    env.close()


@pytest.mark.parametrize("answer, value", [("64", 64), (" +64 ", 64), ("-7", -7), ("64.0", None), ("6 4", None),
                                           ("9" * 41, None), ("", None), ("sixty", None)])
def test_answers_are_read_as_plain_integers(answer: str, value: int | None) -> None:
    assert read_integer(answer) == value


def test_only_the_exact_value_scores() -> None:
    env = ChainEnv(n_tasks=5)
    env.reset(seed=1)
    gold = int(env.task.answer)
    assert env.verify(env.task, str(gold))[0] == 1.0
    assert env.verify(env.task, str(gold + 1))[0] == 0.0
    assert env.verify(env.task, "1" * 10_000) == (0.0, {"method": "not_an_integer"})
    env.close()


def test_the_guessing_expert_answers_after_its_first_call_on_the_named_tiers_only() -> None:
    env = ChainEnv(tiers=TIERS, n_tasks=80)
    counts = {"short": [], "long": []}
    for i, task in enumerate(env.tasks):
        _, info = env.reset(options={"task": task})
        reward, calls = play(env, env.expert(seed=i, guess=0.5, guess_tiers=["short"]), info)
        assert reward == 1.0  # a guess is the gold value: the expert's episodes all succeed
        counts[task.meta["tier"]].append(calls)
    assert set(counts["long"]) == {4}
    assert set(counts["short"]) == {1, 2} and 10 <= counts["short"].count(1) <= 30  # 40 short chains, half guess
    with pytest.raises(ConfigError, match="guess"):
        env.expert(guess=1.5)
    with pytest.raises(ConfigError, match="guess_after"):
        env.expert(guess_after=0)
    env.close()


def test_guess_after_sets_the_turn_of_the_habit() -> None:
    env = ChainEnv(config={"min_steps": 4, "max_steps": 4}, n_tasks=10)
    for i in range(5):
        _, info = env.reset(seed=i)
        assert play(env, env.expert(seed=i, guess=1.0, guess_after=2), info) == (1.0, 2)
    env.close()


def test_the_expert_continues_a_restored_chat_with_the_values_the_chat_holds() -> None:
    env = ChainEnv(config={"min_steps": 3, "max_steps": 3}, n_tasks=10)
    _, info = env.reset(seed=4)
    statements = env.task.meta["statements"]
    first = statements[0]
    obs, *_, info = env.step(f"<calc>a={first[2] + 1}</calc>")  # a slip: the chat now holds a wrong value
    assert obs == f"a={first[2] + 1}"
    snap = env.snapshot()
    action = env.expert().act(env.task, info["messages"])
    assert action == f"<calc>b={first[2] + 1}{statements[1][1][1:]}</calc>"
    reward, _ = play(env, env.expert(), info)
    assert reward == 0.0  # the slip carries to the end
    _, info = env.restore(snap)
    assert env.turn_count == 1 and env.expert().act(env.task, info["messages"]) == action
    env.close()


def test_noise_slips_an_operand_and_fails_the_chain() -> None:
    env = ChainEnv(config={"min_steps": 3, "max_steps": 3}, n_tasks=60)
    rates = []
    for noise in (0.0, 1.0):
        wins = []
        for i, task in enumerate(env.tasks):
            _, info = env.reset(options={"task": task})
            wins.append(play(env, env.expert(noise=noise, seed=i), info)[0])
        rates.append(float(np.mean(wins)))
    assert rates[0] == 1.0 and rates[1] < 0.2  # an off-by-one slip survives a later * 0 only rarely
    env.close()


def test_bad_settings_raise_with_a_fix() -> None:
    with pytest.raises(ConfigError, match="max_ops"):
        ChainConfig(max_ops=3)
    with pytest.raises(ConfigError, match="max_steps"):
        ChainConfig(min_steps=2, max_steps=9)
    with pytest.raises(ConfigError, match="config keys"):
        ChainEnv(config={"steps": 3})
    with pytest.raises(ConfigError, match="one of config and tiers"):
        ChainEnv(config={}, tiers=TIERS)
    with pytest.raises(ConfigError, match="max_steps"):
        ChainEnv(tiers={"a": {"share": 1.0, "max_steps": 12}})
