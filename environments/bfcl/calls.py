"""Decode a model turn into function calls: Hermes `<tool_call>` JSON or BFCL Python-call strings.

Python-call strings (`[cd(folder='x'), ls()]`) are parsed with `ast`; each argument node goes through
`ast.literal_eval`, so nothing is ever evaluated: `__import__('os').system('ls')` is a call whose callee is
not a (dotted) name and decodes to a `BadCall`, and so are arguments nested deeper than
`trace_gym.tools.MAX_ARGUMENT_DEPTH` or holding an integer too long to print. Nothing here raises on model text.
"""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

from trace_gym.actions import load_json
from trace_gym.tools import argument_problem

MAX_ACTION_CHARS = 200_000

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"^```[A-Za-z]*\s*\n?(.*?)\n?```$", re.DOTALL)


@dataclass(frozen=True)
class Call:
    """A decoded call: function name, keyword arguments and positional ones (Python literals).

    Positional arguments occur in BFCL's own ground truth (`sort('final_report.pdf')`); the executor binds
    them to parameter names."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    positional: tuple[Any, ...] = ()


@dataclass(frozen=True)
class BadCall:
    """A call the model attempted that cannot be decoded; `error` is shown to the model."""

    text: str
    error: str


Item = Call | BadCall


@dataclass(frozen=True)
class Decoded:
    """The calls of one model turn; `format` is "none" when the turn holds no call attempt (a plain reply)."""

    items: tuple[Item, ...]
    format: Literal["hermes", "python", "none"]

    @property
    def calls(self) -> tuple[Call, ...]:
        return tuple(i for i in self.items if isinstance(i, Call))

    @property
    def errors(self) -> tuple[BadCall, ...]:
        return tuple(i for i in self.items if isinstance(i, BadCall))


def decode(text: str) -> Decoded:
    """Decode the calls of one model turn (never raises)."""
    if not isinstance(text, str):
        return Decoded((BadCall(repr(text)[:200], f"expected a string action, got {type(text).__name__}"),),
                       "hermes")
    if len(text) > MAX_ACTION_CHARS:
        return Decoded((BadCall(text[:200], f"action longer than {MAX_ACTION_CHARS} characters"),), "hermes")
    text = _THINK.sub("", text, count=1)
    items = _decode_python(text)
    if "<tool_call>" in text and not (items and all(isinstance(i, Call) for i in items)):
        # a list of well-formed python calls may hold the tag inside a string argument: it stays python
        return Decoded(tuple(_decode_hermes(m.group(1)) for m in _TOOL_CALL.finditer(text)), "hermes")
    return Decoded(items, "python") if items else Decoded((), "none")


def _decode_hermes(body: str) -> Item:
    body = body.strip()
    obj, problem = load_json(body)
    if problem is not None:
        return BadCall(body[:200], f"tool call is {problem}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return BadCall(body[:200], 'expected {"name": <function name>, "arguments": {...}}')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some chat templates serialise the arguments object as a string
        args, problem = load_json(args) if args.strip() else ({}, None)
        if problem is not None:
            return BadCall(body[:200], f"arguments string is {problem}")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return BadCall(body[:200], f"expected the arguments to be an object, got {type(args).__name__}")
    problem = argument_problem(args)
    if problem is not None:
        return BadCall(body[:200], f"{obj['name'][:100]}: {problem}")
    return Call(obj["name"], args)


def _decode_python(text: str) -> tuple[Item, ...]:
    """BFCL's prompting format: a list of calls, brackets optional (bfcl_eval default_decode_execute_prompting).

    Text that is not a list of calls is a plain reply: ()."""
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    text = text.strip("`\n ")
    if not text:
        return ()
    wrapped = text if text.startswith("[") else f"[{text}"
    wrapped = wrapped if wrapped.endswith("]") else f"{wrapped}]"
    try:
        with warnings.catch_warnings():  # invalid escapes in model strings warn at parse time
            warnings.simplefilter("ignore")
            tree = ast.parse(wrapped, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    body = tree.body
    elements = body.elts if isinstance(body, ast.List | ast.Tuple) else [body]
    calls = [e for e in elements if isinstance(e, ast.Call)]
    if not calls or len(calls) != len(elements):
        return ()
    return tuple(_decode_call_node(e) for e in calls)


def _dotted_name(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _decode_call_node(node: ast.Call) -> Item:
    try:
        source = ast.unparse(node)[:200]
    except (ValueError, RecursionError):
        source = "<call>"
    name = _dotted_name(node.func)
    if name is None:
        return BadCall(source, "the callee must be a function name, e.g. ls() or math.factorial(number=5)")
    positional: list[Any] = []
    for arg in node.args:
        try:
            positional.append(ast.literal_eval(arg))
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return BadCall(source, f"{name}: arguments must be literals (string, number, list, dict, "
                                   "True/False/None)")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            return BadCall(source, f"{name}: **kwargs are not allowed; pass each argument by keyword")
        try:
            args[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return BadCall(source, f"{name}: argument {kw.arg!r} must be a literal (string, number, list, "
                                   "dict, True/False/None)")
    problem = argument_problem(args) or argument_problem(dict(enumerate(positional)))
    if problem is not None:
        return BadCall(source, f"{name}: {problem}")
    return Call(name, args, tuple(positional))


def to_python_call(call: Call) -> str:
    """BFCL Python-call string of a call (repr of each value: eval of it gives the same values back)."""
    args = [repr(v) for v in call.positional] + [f"{k}={v!r}" for k, v in call.arguments.items()]
    return f"{call.name}({', '.join(args)})"


def parse_ground_truth_call(source: str) -> Call:
    """Decode one BFCL ground-truth call string; raises ValueError if it is not a literal call (data error)."""
    items = _decode_python(source)
    if len(items) != 1 or not isinstance(items[0], Call):
        raise ValueError(f"expected one literal BFCL call, got {source!r}")
    return items[0]
