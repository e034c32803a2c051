"""The base classes' plumbing: what every episode starts from, whatever a subclass's hooks do."""

from __future__ import annotations

from typing import Any

import pytest

from trace_gym import ConfigError, HermesParser, Task, TextEnv, Tool, ToolCall, ToolEnv, ToolError, Turn


class EchoTurns(TextEnv):
    """A ``begin`` that leaves ``messages`` alone, as a subclass may write it."""

    def begin(self, task: Task) -> str:
        return task.prompt

    def turn(self, action: str) -> Turn:
        return Turn(f"heard {action}")


def test_every_episode_starts_with_fresh_messages() -> None:
    env = EchoTurns(tasks=[Task(id="a", prompt="first"), Task(id="b", prompt="second")], max_turns=3)
    env.reset(options={"index": 0})
    env.step("from episode one")
    _, info = env.reset(options={"index": 1})
    assert info["messages"] == []
    *_, info = env.step("from episode two")
    assert [m["content"] for m in info["messages"]] == ["from episode two", "heard from episode two"]


class Lookup(ToolEnv):
    """A table lookup whose tool says a missing key is the model's mistake, and has a bug for one key."""

    def tools(self) -> list[Tool]:
        return [Tool.from_function(self.lookup)]

    def lookup(self, key: str) -> str:
        """Look a key up."""
        if key == "bug":
            return {"a": "1"}["b"]  # the tool's own defect
        if key == "long":
            return "x" * 100
        if key not in ("a", "b"):
            raise ToolError(f"expected key 'a' or 'b', got {key!r}")
        return key.upper()

    def verify(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return float(answer == "A"), {}


def _call(key: str) -> str:
    return HermesParser().format(ToolCall("lookup", {"key": key}))


def test_a_tool_error_becomes_an_observation() -> None:
    env = Lookup(tasks=[Task(id="t", prompt="Look up a.")])
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step(_call("z"))
    assert obs == "Error: lookup failed: expected key 'a' or 'b', got 'z'" and info["error"] in obs
    assert (reward, terminated) == (0.0, False)


def test_a_tool_with_a_bug_raises_out_of_step() -> None:
    env = Lookup(tasks=[Task(id="t", prompt="Look up a.")])
    env.reset(seed=0)
    with pytest.raises(KeyError):
        env.step(_call("bug"))


def test_calls_past_the_per_turn_limit_are_answered_not_run() -> None:
    env = Lookup(tasks=[Task(id="t", prompt="Look up a.")], max_tool_calls=2)
    env.reset(seed=0)
    action = HermesParser().format(*(ToolCall("lookup", {"key": k}) for k in "abab"))
    obs, *_, info = env.step(action)
    replies = [m["content"] for m in info["messages"][-4:]]
    over = "not run: over the limit of 2 tool calls per turn"
    assert replies == ["A", "B", f"Error: {over}", "Error: not run"] and obs == "\n\n".join(replies)
    assert info["error"] == f"2 calls {over}" and info["tool_calls"] == 4


def test_each_result_is_cut_at_max_result_chars() -> None:
    env = Lookup(tasks=[Task(id="t", prompt="Look up a.")], max_result_chars=10)
    env.reset(seed=0)
    obs, *_ = env.step(_call("long"))
    assert obs == "x" * 10 + "\n[... truncated 90 characters]"


def test_expert_is_declared_and_none_means_the_env_has_none() -> None:
    from trace_gym.agents.specs import policy_from_spec

    assert TextEnv.expert is None and Lookup.expert is None
    with pytest.raises(ConfigError, match="scripted expert"):
        policy_from_spec("expert", make_env=lambda: Lookup(tasks=[Task(id="t", prompt="Look up a.")]))


def test_tool_instructions_are_appended_unless_switched_off() -> None:
    from trace_gym.actions import TagParser

    env = Lookup()
    assert env.system_message().startswith(env.system_prompt + "\n\n") and "<tool_call>" in env.system_message()
    assert Lookup(tool_instructions=False).system_message() == env.system_prompt
    assert Lookup(parser=TagParser(), tool_instructions=False).native_system_message() == env.system_prompt

    class Quiet(Lookup):
        tool_instructions = False

    assert Quiet().system_message() == Quiet().native_system_message() == env.system_prompt


def test_the_native_system_message_drops_the_text_format_and_keeps_a_subclass_addition() -> None:
    from trace_gym.actions import TagParser
    from trace_gym.env import NATIVE_INSTRUCTIONS

    class Noted(Lookup):
        compact_prompt = "Use <lookup>, then <answer>."

        def system_message(self) -> str:
            return super().system_message() + " Be brief."

    for parser in (HermesParser(), TagParser()):
        native = Noted(parser=parser).native_system_message()
        assert NATIVE_INSTRUCTIONS in native and "<tool_call>" not in native and "<lookup>" not in native
        assert native.startswith(Noted.system_prompt)
    assert Noted().native_system_message().endswith(" Be brief.")


def test_a_native_prompt_replaces_the_task_instructions_for_native_calls_only() -> None:
    class Tagged(Lookup):
        system_prompt = "Look it up, then reply <answer>the value</answer>."
        native_prompt = "Look it up, then reply with the value."

    env = Tagged()
    assert env.system_message().startswith(Tagged.system_prompt)
    native = env.native_system_message()
    assert native.startswith(Tagged.native_prompt) and "<answer>" not in native


@pytest.mark.parametrize("env_id", ["trace/Arithmetic-v0", "trace/ArithmeticChain-v0", "trace/Math-v0",
                                    "trace/HotpotQA-v0"])
def test_no_bundled_env_names_a_text_tag_to_a_model_that_calls_natively(env_id: str) -> None:
    from trace_gym.env_specs import make_env

    env = make_env(env_id)
    try:
        native = env.unwrapped.native_system_message()
    finally:
        env.close()
    assert not any(tag in native for tag in ("<answer>", "</answer>", "<tool_call>", "<python>", "<calc>"))
