import json

import pytest

from trace_gym import ConfigError, Tool, ToolCall, ToolError, call_tool
from trace_gym.tools import argument_problem


def lookup(key: str, limit: int = 3, exact: bool = False) -> str:
    """Look a key up.

    key: what to look up
    limit: how many results
    """
    return f"{key}:{limit}:{exact}"


def refuse(x: int) -> str:
    """Refuses every value: the model's mistake, said as a ToolError."""
    raise ToolError(f"expected a positive x, got {x}")


def buggy(x: int) -> str:
    """A tool with a bug."""
    return {}[x]


TOOLS = {t.name: t for t in (Tool.from_function(lookup), Tool.from_function(refuse), Tool.from_function(buggy))}


def test_schema_from_type_hints_and_docstring():
    params = TOOLS["lookup"].parameters
    assert params["required"] == ["key"]
    assert params["properties"]["key"] == {"type": "string", "description": "what to look up"}
    assert params["properties"]["limit"]["type"] == "integer"
    assert params["properties"]["exact"]["type"] == "boolean"
    assert TOOLS["lookup"].schema()["function"]["description"] == "Look a key up."


def test_a_google_style_args_section_describes_every_parameter_the_first_included():
    def add(a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: the first number
            b: the second number
        """
        return str(a + b)

    props = Tool.from_function(add).parameters["properties"]
    assert props["a"]["description"] == "the first number" and props["b"]["description"] == "the second number"


def test_valid_call_runs():
    assert call_tool(TOOLS, ToolCall("lookup", {"key": "k", "limit": 5})) == ("k:5:False", None)


@pytest.mark.parametrize("call, fragment", [
    (ToolCall("nope", {}), "unknown tool 'nope'"),
    (ToolCall("lookup", {}), "'key' is a required property"),
    (ToolCall("lookup", {"key": "k", "limit": "five"}), "limit: 'five' is not of type 'integer'"),
    (ToolCall("lookup", {"key": "k", "extra": 1}), "Additional properties are not allowed"),
    (ToolCall("refuse", {"x": -1}), "refuse failed: expected a positive x, got -1"),
])
def test_bad_calls_become_error_observations(call, fragment):
    observation, error = call_tool(TOOLS, call)
    assert fragment in error and observation.startswith("Error: ")


def test_a_tool_bug_raises():
    with pytest.raises(KeyError):
        call_tool(TOOLS, ToolCall("buggy", {"x": 1}))


def test_long_results_are_truncated_with_a_note():
    tools = {"echo": Tool.from_function(lambda text: text * 3, name="echo")}
    observation, error = call_tool(tools, ToolCall("echo", {"text": "x" * 100}), max_chars=50)
    assert error is None and observation.startswith("x" * 50) and "truncated 250 characters" in observation


def test_invalid_tool_definitions_raise_config_errors():
    with pytest.raises(ConfigError, match="tool name"):
        Tool("bad name", "d", {"type": "object"}, fn=print)
    with pytest.raises(ConfigError, match="type 'object'"):
        Tool("ok", "d", {"type": "string"}, fn=print)


@pytest.mark.parametrize(("arguments", "fragment"), [
    ({"key": "k", "limit": 10**5000}, "integer argument is too long"),
    ({"key": "k", "extra": json.loads("[" * 40 + "]" * 40)}, "nested deeper than 32"),
])
def test_arguments_python_code_cannot_handle_are_error_observations(arguments, fragment):
    observation, error = call_tool(TOOLS, ToolCall("lookup", arguments))
    assert fragment in error and observation.startswith("Error: ")


def test_argument_depth_is_checked_without_recursion():
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    assert argument_problem({"x": nested}) == "arguments nested deeper than 32 levels"
    assert argument_problem({"x": [[["ok"]]], "n": 10**4000}) is None
