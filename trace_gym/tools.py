"""Tools: a typed callable with a name, a description and a JSON schema, dispatched after validation; and
``ToolCall``, one requested invocation (what an action parser produces and formats)."""

from __future__ import annotations

import inspect
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import jsonschema

from trace_gym.errors import ConfigError, ToolError

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object"}
MAX_ARGUMENT_DEPTH = 32
"""How deep a call's arguments may nest (lists, dicts): tool arguments written by hand never come close, while
recursive code (schema validation, ``repr``, ``copy.deepcopy``) overflows the stack at a few hundred levels."""
_LOG10_2 = math.log10(2)


@dataclass(frozen=True)
class ToolCall:
    """One requested tool invocation."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Tool:
    """A tool the model may call. ``fn`` receives validated keyword arguments and returns text."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any] = field(compare=False, repr=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", self.name):
            raise ConfigError(f"expected a tool name of letters, digits and _.-, got {self.name!r}")
        if self.parameters.get("type") != "object":
            raise ConfigError(f"expected tool {self.name!r} parameters with type 'object', got {self.parameters}")
        jsonschema.Draft202012Validator.check_schema(self.parameters)

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling form that chat templates render."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @cached_property
    def validator(self) -> jsonschema.Draft202012Validator:
        """The JSON-schema validator of the tool's parameters (built once)."""
        return jsonschema.Draft202012Validator(self.parameters)

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None, description: str | None = None) -> Tool:
        """Build the schema from type hints; the docstring's first paragraph is the description and its
        ``name: text`` lines describe the parameters."""
        doc = inspect.getdoc(fn) or ""
        hints = typing.get_type_hints(fn)
        # [ \t], not \s: a line "Args:" would otherwise swallow the next line (the first parameter's).
        arg_docs = dict(re.findall(r"^[ \t]*(\w+)[ \t]*(?:\([^)]*\))?:[ \t]*(.+)$", doc, flags=re.MULTILINE))
        properties: dict[str, Any] = {}
        required: list[str] = []
        for pname, param in inspect.signature(fn).parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or pname == "self":
                continue
            prop = _json_type(hints.get(pname, str))
            if pname in arg_docs:
                prop["description"] = arg_docs[pname].strip()
            properties[pname] = prop
            if param.default is inspect.Parameter.empty:
                required.append(pname)
        schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
        summary = description or doc.split("\n\n")[0].replace("\n", " ").strip() or (name or fn.__name__)
        return cls(name=name or fn.__name__, description=summary, parameters=schema, fn=fn)


def _json_type(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _json_type(args[0]) if len(args) == 1 else {}
    if origin in (list, tuple):
        items = typing.get_args(hint)
        return {"type": "array", "items": _json_type(items[0])} if items else {"type": "array"}
    if origin is dict:
        return {"type": "object"}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(hint))}
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    return {}


def argument_problem(value: Any, max_depth: int = MAX_ARGUMENT_DEPTH) -> str | None:
    """Why decoded call arguments (plain data: JSON or Python literals) cannot go to a tool, or None: nested
    deeper than ``max_depth``, or an integer too long to print (``str()`` of it raises ``ValueError`` past
    ``sys.get_int_max_str_digits()`` digits). Iterative, so any depth is answered without recursion."""
    max_digits = sys.get_int_max_str_digits()
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple | set | frozenset):
            children = item
        else:
            if isinstance(item, int) and max_digits and item.bit_length() * _LOG10_2 >= max_digits:
                return f"an integer argument is too long (about {max_digits} digits or more)"
            continue
        if depth >= max_depth:
            return f"arguments nested deeper than {max_depth} levels"
        stack.extend((child, depth + 1) for child in children)
    return None


def call_tool(tools: Mapping[str, Tool], call: ToolCall, max_chars: int = 8000) -> tuple[str, str | None]:
    """Validate and run one call. Returns ``(observation, error)``.

    The model's mistakes are answered, not raised: an unknown tool, arguments that break the schema (or nest
    deeper than ``MAX_ARGUMENT_DEPTH``, or hold an integer too long to print), and a
    ``ToolError`` raised by the tool. Any other exception from the tool (a sandbox that cannot start, a bug)
    propagates: shown to the model, it would look like the model's fault and hide the failure from the run."""
    tool = tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        msg = f"unknown tool {call.name!r}; available tools: {known}"
        return f"Error: {msg}", msg
    problem = argument_problem(call.arguments)
    if problem is not None:
        msg = f"invalid arguments for {call.name}: {problem}"
        return f"Error: {msg}", msg
    problems = sorted(tool.validator.iter_errors(call.arguments), key=lambda e: list(e.path))
    if problems:
        where = "/".join(str(p) for p in problems[0].path) or "arguments"
        msg = f"invalid arguments for {call.name}: {where}: {problems[0].message}"
        return f"Error: {msg}", msg
    try:
        result = tool.fn(**call.arguments)
    except ToolError as exc:
        msg = f"{call.name} failed: {exc}"
        return f"Error: {msg}", msg
    text = result if isinstance(result, str) else str(result)
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[... truncated {len(text) - max_chars} characters]"
    return text, None
