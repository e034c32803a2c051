"""Arithmetic chains (``trace/ArithmeticChain-v0``): a task whose outcome is decided after the first turn.

A task is a chain of statements, each applying one or two operators to the previous statement's value::

    a=7+5, b=a*3-4, c=b*2. Find c.

The only tool is ``calc``, a calculator that evaluates integer expressions with at most ``max_ops`` (2) binary
operators per call and knows no names. An episode therefore needs one call per statement, and every call but
the first carries the previous call's result, copied by the model: ``<calc>a=7+5</calc>`` -> ``a=12``,
``<calc>b=12*3-4</calc>`` -> ``b=32``, ``<calc>c=32*2</calc>`` -> ``c=64``, ``<answer>64</answer>``. A call
may name its result (``b=...``); the calculator echoes the name, so a model can read where in the chain it
is. Nothing is spaced: the tiny model reads one token per character, and spaces would be a third of them.
Each intermediate value matters: a copy slip at any call fails the episode, and a policy that
answers before the chain is done (the warm start's habit on one tier, `experts.ChainExpert`) fails it at that
turn. So, unlike Arithmetic (where the one decision, to run the tool or guess, is taken at turn 1), the
outcome of a chain is still open at every prefix of depth >= 1.

The calculator is a small recursive-descent parser over digits, ``+ - *``, parentheses and unary minus:
nothing is evaluated by Python's ``eval``, names are refused, and the input's length, literal size and
nesting are bounded, so any call is answered in microseconds. Answers are read as integers and compared with
the gold value exactly. The env holds no state beyond the base class's, so native snapshots are plain copies.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from trace_gym.env import ToolEnv
from trace_gym.environments.math.arithmetic import make_tiered_tasks, parse_tiers
from trace_gym.environments.math.env import make_parser
from trace_gym.errors import ConfigError, ToolError
from trace_gym.tasks import Task
from trace_gym.tools import Tool

NAMES = "abcdefgh"
"""Statement names, in order: a chain has at most len(NAMES) statements."""
MAX_CALC_CHARS = 200
MAX_LITERAL_DIGITS = 30
MAX_NESTING = 8
MAX_ANSWER_CHARS = 40
_LABEL = re.compile(r"\s*([a-z][a-z0-9_]{0,7})\s*=(?!=)(.*)", re.DOTALL)
_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*()])|([A-Za-z_]\w*)|(\S))")
_INTEGER = re.compile(r"[+-]?\d+")


# --------------------------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class ChainConfig:
    """How long and how hard the generated chains are."""

    min_steps: int = 2
    """Fewest statements per chain (calls an episode needs)."""
    max_steps: int = 3
    """Most statements per chain."""
    min_ops: int = 1
    """Fewest operators per statement (the first statement has at least one more operand than operators)."""
    max_ops: int = 2
    """Most operators per statement; at most the calculator's limit, so that one call computes a statement."""
    min_digits: int = 1
    """Fewest digits per operand."""
    max_digits: int = 1
    """Most digits per operand."""
    max_value: int = 99
    """Largest absolute value of any statement (redrawn until it holds): the numbers a model must copy."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps <= len(NAMES):
            raise ConfigError(f"expected 1 <= min_steps <= max_steps <= {len(NAMES)}, got {self.min_steps}, "
                              f"{self.max_steps}")
        if not 1 <= self.min_ops <= self.max_ops <= 2:
            raise ConfigError(f"expected 1 <= min_ops <= max_ops <= 2 (the calculator's limit), got {self.min_ops}, "
                              f"{self.max_ops}")
        if not 1 <= self.min_digits <= self.max_digits <= 9:
            raise ConfigError(f"expected 1 <= min_digits <= max_digits <= 9, got {self.min_digits}, {self.max_digits}")
        if self.max_value < 10:
            raise ConfigError(f"expected max_value >= 10, got {self.max_value}; fix: max_value=99")


def _operand(rng: np.random.Generator, cfg: ChainConfig) -> int:
    digits = int(rng.integers(cfg.min_digits, cfg.max_digits + 1))
    return int(rng.integers(10 ** (digits - 1) if digits > 1 else 0, 10**digits))


def _apply(terms: Sequence[int | str], ops: Sequence[str]) -> int:
    """The value of ``terms[0] ops[0] terms[1] ...`` with the usual precedence (all terms are ints here)."""
    return calc_value("".join(str(x) for pair in zip(terms, [*ops, ""]) for x in pair))


def make_chain_task(rng: np.random.Generator, cfg: ChainConfig, index: int) -> Task:
    """One chain; ``meta['statements']`` holds each statement as (name, right-hand side with the previous name,
    value), ``meta['steps']`` their count."""
    steps = int(rng.integers(cfg.min_steps, cfg.max_steps + 1))
    statements: list[tuple[str, str, int]] = []
    prev: int | None = None
    for k in range(steps):
        for _ in range(100):
            n_ops = int(rng.integers(cfg.min_ops, cfg.max_ops + 1))
            ops = [str(rng.choice(["+", "-", "*"])) for _ in range(n_ops)]
            operands = [_operand(rng, cfg) for _ in range(n_ops + (1 if prev is None else 0))]
            terms: list[int] = operands if prev is None else [prev, *operands]
            value = _apply(terms, ops)
            if abs(value) <= cfg.max_value:
                break
        else:  # nothing drawn fits: step towards zero, which always does
            ops = ["-" if (prev or 0) > 0 else "+"]
            operands = [int(rng.integers(0, 10))] * (2 if prev is None else 1)
            terms = operands if prev is None else [prev, *operands]
            value = _apply(terms, ops)
        shown = [str(t) for t in terms] if prev is None else [NAMES[k - 1], *(str(t) for t in operands)]
        rhs = shown[0] + "".join(f"{op}{t}" for op, t in zip(ops, shown[1:]))
        statements.append((NAMES[k], rhs, value))
        prev = value
    prompt = ", ".join(f"{name}={rhs}" for name, rhs, _ in statements) + f". Find {statements[-1][0]}."
    return Task(id=f"chain-{index}", prompt=prompt, answer=str(statements[-1][2]),
                meta={"statements": [list(s) for s in statements], "steps": steps})


def make_chain_tasks(n: int, cfg: ChainConfig | None = None, seed: int = 0) -> list[Task]:
    """``n`` chains, the same for the same ``cfg`` and ``seed``."""
    rng = np.random.default_rng(seed)
    cfg = cfg or ChainConfig()
    return [make_chain_task(rng, cfg, i) for i in range(n)]


# --------------------------------------------------------------------------------------------- the calculator
class _Parser:
    """expr := term (('+' | '-') term)*; term := factor ('*' factor)*; factor := '-' factor | int | '(' expr ')'."""

    def __init__(self, text: str, max_ops: int):
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:  # only trailing whitespace is left
                break
            pos = m.end()
            number, op, name, other = m.groups()
            if name is not None:
                raise ToolError(f"calc reads numbers only, and {name!r} is a name: write its value instead")
            if other is not None:
                raise ToolError(f"unexpected character {other!r}: calc takes integers, + - * and parentheses")
            if number is not None and len(number) > MAX_LITERAL_DIGITS:
                raise ToolError(f"a number of {len(number)} digits is over calc's {MAX_LITERAL_DIGITS}")
            self.tokens.append(("num", number) if number is not None else ("op", op))
        self.pos, self.max_ops, self.ops, self.depth = 0, max_ops, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        if self.pos >= len(self.tokens):
            raise ToolError("the expression ends too early: a number or '(' is missing")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def binary(self) -> None:
        self.ops += 1
        if self.ops > self.max_ops:
            raise ToolError(f"calc evaluates at most {self.max_ops} operators per call: split the expression "
                            "over several calls")

    def expr(self) -> int:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()[1]
            self.binary()
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> int:
        value = self.factor()
        while self.peek() == "*":
            self.take()
            self.binary()
            value *= self.factor()
        return value

    def factor(self) -> int:
        kind, text = self.take()
        if kind == "num":
            return int(text)
        if text == "-":
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise ToolError(f"more than {MAX_NESTING} nested signs or parentheses")
            value = -self.factor()
            self.depth -= 1
            return value
        if text == "(":
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise ToolError(f"more than {MAX_NESTING} nested signs or parentheses")
            value = self.expr()
            if self.peek() != ")":
                raise ToolError("unbalanced parentheses: a ')' is missing")
            self.take()
            self.depth -= 1
            return value
        raise ToolError(f"expected a number or '(' but found {text!r}")


def calc_value(expression: str, max_ops: int = 2) -> int:
    """The integer value of ``expression`` (digits, ``+ - *``, parentheses, unary minus, at most ``max_ops``
    binary operators); ``ToolError`` with a message for the model otherwise."""
    if len(expression) > MAX_CALC_CHARS:
        raise ToolError(f"an expression of {len(expression)} characters is over calc's {MAX_CALC_CHARS}")
    parser = _Parser(expression, max_ops)
    if not parser.tokens:
        raise ToolError("empty expression: write e.g. <calc>a=3+4</calc>")
    value = parser.expr()
    if parser.pos != len(parser.tokens):
        raise ToolError(f"unexpected {parser.peek()!r} after a complete expression")
    return value


def calc(expression: str, max_ops: int = 2) -> str:
    """What the ``calc`` tool prints for one call: ``name=value`` for ``name=expression``, else the value."""
    label = _LABEL.fullmatch(expression)
    if label is not None:
        return f"{label.group(1)}={calc_value(label.group(2), max_ops)}"
    return str(calc_value(expression, max_ops))


def calc_tool(max_ops: int = 2) -> Tool:
    return Tool(name="calc",
                description=f"Evaluate an integer expression with + - * and at most {max_ops} operators; "
                            "'name=expression' prints 'name=value'.",
                parameters={"type": "object", "properties": {"expression": {
                    "type": "string", "description": "e.g. b=12*3-4"}}, "required": ["expression"]},
                fn=lambda expression: calc(expression, max_ops))


def read_integer(answer: str) -> int | None:
    """The integer an answer states (sign, digits, surrounding spaces), or None."""
    text = answer.strip()
    if len(text) > MAX_ANSWER_CHARS or _INTEGER.fullmatch(text) is None:
        return None
    return int(text)


# --------------------------------------------------------------------------------------------- the env
class ChainEnv(ToolEnv):
    """Arithmetic chains with a two-operator calculator (module docstring). Tag format by default, for the
    quickstart's tiny model; ``tiers=`` mixes chain difficulties in given shares (``meta['tier']``)."""

    system_prompt = ("Compute the chain with the calc tool, one statement per call, copying each result into "
                     "the next call; then reply <answer>the number</answer>.")
    native_prompt = ("Compute the chain with the calc tool, one statement per call, copying each result into the "
                     "next call; then reply with the number.")
    compact_prompt = "Use <calc> per step, then <answer>."

    def __init__(self, config: ChainConfig | Mapping[str, Any] | None = None, n_tasks: int = 2000,
                 task_seed: int = 0, tiers: Mapping[str, Mapping[str, Any]] | None = None, max_ops: int = 2,
                 action_format: Literal["tags", "hermes"] = "tags", max_turns: int = 10, **kwargs: Any):
        super().__init__(max_turns=max_turns, parser=make_parser(action_format), **kwargs)
        if config is not None and tiers is not None:
            raise ConfigError("expected one of config and tiers, got both; pass one")
        if isinstance(config, Mapping):  # from YAML or gym.make
            known = {f.name for f in dataclasses.fields(ChainConfig)}
            if set(config) - known:
                raise ConfigError(f"expected config keys among {sorted(known)}, got {sorted(set(config) - known)}")
            config = ChainConfig(**config)
        if max_ops < 1:
            raise ConfigError(f"expected max_ops >= 1, got {max_ops}")
        self.config = config or ChainConfig()
        self.tiers = parse_tiers(tiers, ChainConfig) if tiers is not None else None
        self.n_tasks, self.task_seed, self.max_ops = n_tasks, task_seed, max_ops
        self.action_format = action_format

    def load_tasks(self) -> Sequence[Task]:
        if self.tiers is not None:
            return make_tiered_tasks(self.n_tasks, self.tiers, self.task_seed, make=make_chain_task)
        return make_chain_tasks(self.n_tasks, self.config, self.task_seed)

    def tools(self) -> Sequence[Tool]:
        return [calc_tool(self.max_ops)]

    def verify(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        value = read_integer(answer)
        if value is None:
            return 0.0, {"method": "not_an_integer"}
        return float(value == int(task.answer)), {"method": "integer"}

    def example_actions(self) -> list[str]:
        from trace_gym.tools import ToolCall

        answer = str(self.task.answer) if self.task is not None else "0"
        calls = ["a=3+4*5", "2*(3-8)", "1+2+3+4", "a+1", "b=99999*-7", "c = 1 - -2"]
        return [self.parser.format(ToolCall("calc", {"expression": c})) for c in calls] + [
            self.parser.format_answer(answer), self.parser.format_answer("-1")]

    def expert(self, noise: float = 0.0, seed: int = 0, guess: float = 0.0,
               guess_tiers: Sequence[str] | None = None, guess_after: int = 1) -> Any:
        """The scripted expert (`experts.ChainExpert`): ``guess`` of its episodes answer after ``guess_after``
        calls instead of finishing the chain (only on ``guess_tiers`` when given)."""
        from trace_gym.environments.math.experts import ChainExpert

        return ChainExpert(self.action_format, noise=noise, seed=seed, guess=guess, guess_tiers=guess_tiers,
                           guess_after=guess_after)
