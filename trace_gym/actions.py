"""Action parsers: the assistant's turn (text) -> tool calls, final answer, or a parse error; and back.

``parse`` reads a turn; ``format`` and ``format_answer`` write one (what scripted experts and the conformance
checker use), so that ``parse(format(call)).calls == (call,)``. Parsers scan with ``str.find`` rather than lazy
regexes so that megabytes of unclosed tags stay linear.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trace_gym.errors import ConfigError
from trace_gym.tools import Tool, ToolCall

__all__ = ["ActionParser", "HermesParser", "ParsedAction", "TagParser", "ToolCall", "find_blocks", "format_answer",
           "load_json"]


@dataclass(frozen=True)
class ParsedAction:
    """What a turn asked for. ``error`` is a message for the model when the turn is malformed."""

    text: str
    calls: tuple[ToolCall, ...] = ()
    answer: str | None = None
    error: str | None = None


class ActionParser(Protocol):
    """Turns assistant text into calls and an answer, and writes them. Contract: ``parse`` never raises on any
    ``str``; ``parse(format(call), tools).calls == (call,)`` for every call the format can express."""

    def parse(self, text: str, tools: Mapping[str, Tool]) -> ParsedAction: ...

    def instructions(self, tools: Sequence[Tool]) -> str: ...

    def format(self, *calls: ToolCall) -> str:
        """One turn's text that makes ``calls``, in order."""
        ...

    def format_answer(self, answer: str) -> str:
        """One turn's text that gives ``answer`` as the final answer."""
        ...


def format_answer(answer: str) -> str:
    """The final-answer turn, the same in every format this module parses."""
    return f"<answer>{answer}</answer>"


def find_blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[str], bool]:
    """Bodies of ``open_tag ... close_tag`` blocks in order, and whether an opened block was left unclosed."""
    bodies: list[str] = []
    pos = 0
    while (start := text.find(open_tag, pos)) != -1:
        end = text.find(close_tag, start + len(open_tag))
        if end == -1:
            return bodies, True
        bodies.append(text[start + len(open_tag) : end])
        pos = end + len(close_tag)
    return bodies, False


def load_json(text: str) -> tuple[Any, str | None]:
    """``(value, None)`` for JSON text, else ``(None, why)`` with ``why`` written for the model. Never raises: an
    integer past Python's 4,300-digit limit and nesting past the recursion limit are answered like bad JSON."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc})"
    except ValueError:  # int() of a literal with more digits than sys.get_int_max_str_digits()
        return None, f"JSON with an integer too long to read (over {sys.get_int_max_str_digits()} digits)"
    except RecursionError:
        return None, "JSON nested too deeply to read"


def _answer(text: str) -> tuple[str | None, str | None]:
    bodies, unclosed = find_blocks(text, "<answer>", "</answer>")
    if unclosed and not bodies:
        return None, "an answer tag was opened and not closed: " + _AS_SHOWN
    return (bodies[-1].strip(), None) if bodies else (None, None)


_ANSWER_HELP = "When you know the final answer, reply with <answer>your answer</answer> and no tool call."
# Error observations name the markup without writing it: a small model copies the text it was just shown, and an
# error that quoted "<tool_call>" came back as a new unclosed call, turn after turn.
_AS_SHOWN = "write calls and the final answer as the system message shows"
_NOTHING = "found no tool call and no final answer; " + _AS_SHOWN
# A model trained on Hermes calls (Qwen's chat template) writes them on a tag-format env whatever its prompt says.
_JSON_ON_TAGS = ("found a JSON tool call, which this env does not read (it takes tool tags); " + _AS_SHOWN +
                 ". An env built with action_format=hermes reads JSON tool calls")
# Inside a JSON string these would end the call block or start an answer early; "\u003c" is the same "<".
_MARKERS = ("<tool_call>", "</tool_call>", "<answer>", "</answer>")


class HermesParser:
    """Hermes/Qwen3 tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several per turn."""

    def parse(self, text: str, tools: Mapping[str, Tool]) -> ParsedAction:
        bodies, unclosed = find_blocks(text, "<tool_call>", "</tool_call>")
        if unclosed:
            return ParsedAction(text, error="a tool call was opened and not closed: " + _AS_SHOWN)
        calls = []
        for body in bodies:
            obj, problem = load_json(body)
            if problem is not None:
                return ParsedAction(text, error=f"tool call is {problem}; expected "
                                    '{"name": "<tool>", "arguments": {...}}')
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return ParsedAction(text, error='expected a tool call object {"name": "<tool>", "arguments": {...}}')
            args = obj.get("arguments", {})
            if isinstance(args, str):  # some models emit the arguments as a JSON string
                args, problem = load_json(args)
                if problem is not None:
                    return ParsedAction(text, error=f"tool call arguments are a string that is {problem}")
            if not isinstance(args, dict):
                return ParsedAction(text, error=f"expected tool call arguments as an object, got {type(args).__name__}")
            calls.append(ToolCall(obj["name"], args))
        answer, error = _answer(text)
        if error:
            return ParsedAction(text, error=error)
        if calls and answer is not None:
            return ParsedAction(text, error="a turn gives either tool calls or a final answer, not both")
        if not calls and answer is None:
            return ParsedAction(text, error=_NOTHING)
        return ParsedAction(text, calls=tuple(calls), answer=answer)

    def instructions(self, tools: Sequence[Tool]) -> str:
        schemas = "\n".join(json.dumps(t.schema(), ensure_ascii=False) for t in tools)
        return (
            "You may call these tools:\n<tools>\n" + schemas + "\n</tools>\n"
            "To call a tool, write <tool_call>{\"name\": <tool-name>, \"arguments\": <args-json-object>}"
            "</tool_call>. The results come back in the next message. " + _ANSWER_HELP
        )

    def format(self, *calls: ToolCall) -> str:
        blocks = []
        for call in calls:
            body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
            for marker in _MARKERS:
                body = body.replace(marker, "\\u003c" + marker[1:])
            blocks.append(f"<tool_call>{body}</tool_call>")
        return "\n".join(blocks)

    def format_answer(self, answer: str) -> str:
        return format_answer(answer)


class TagParser:
    """Tag-style actions: ``<search>query</search>``, ``<python>code</python>``, ``<answer>...</answer>``.

    A tag names a tool; its body fills the tool's single required string argument.
    """

    def parse(self, text: str, tools: Mapping[str, Tool]) -> ParsedAction:
        found: list[tuple[int, ToolCall]] = []
        for name, tool in tools.items():
            pos = 0
            while (start := text.find(f"<{name}>", pos)) != -1:
                end = text.find(f"</{name}>", start)
                if end == -1:
                    return ParsedAction(text, error=f"a {name} tag was opened and not closed: " + _AS_SHOWN)
                found.append((start, ToolCall(name, {_text_argument(tool): text[start + len(name) + 2 : end]})))
                pos = end + len(name) + 3
        answer, error = _answer(text)
        if error:
            return ParsedAction(text, error=error)
        calls = tuple(call for _, call in sorted(found, key=lambda item: item[0]))
        if calls and answer is not None:
            return ParsedAction(text, error="a turn gives either a tool call or a final answer, not both")
        if not calls and answer is None:
            return ParsedAction(text, error=_JSON_ON_TAGS if "<tool_call>" in text else _NOTHING)
        return ParsedAction(text, calls=calls, answer=answer)

    def instructions(self, tools: Sequence[Tool]) -> str:
        lines = [f"- <{t.name}>{_text_argument(t)}</{t.name}>: {t.description}" for t in tools]
        return "You may use these tools by writing their tags:\n" + "\n".join(lines) + "\n" + _ANSWER_HELP

    def format(self, *calls: ToolCall) -> str:
        """Raises ``ConfigError`` for a call a tag cannot express: not exactly one string argument, or a body that
        contains a tag of its own."""
        out = []
        for call in calls:
            values = list(call.arguments.values())
            if len(values) != 1 or not isinstance(values[0], str):
                raise ConfigError(f"expected one string argument for the tag format, got {call.arguments!r} for "
                                  f"{call.name!r}; fix: use action_format='hermes' for tools with several arguments")
            if "<" in values[0] and any(m in values[0] for m in (f"</{call.name}>", "<answer>", "</answer>")):
                raise ConfigError(f"expected a tag body without </{call.name}> or <answer> tags, got {values[0]!r}")
            out.append(f"<{call.name}>{values[0]}</{call.name}>")
        return "\n".join(out)

    def format_answer(self, answer: str) -> str:
        return format_answer(answer)


def _text_argument(tool: Tool) -> str:
    """The argument that a tag's body fills: the first required string parameter."""
    props = tool.parameters.get("properties", {})
    for pname in tool.parameters.get("required", []) or list(props):
        if props.get(pname, {}).get("type") == "string":
            return pname
    return next(iter(props), "input")
