"""A small real tool env for agent tests: integer arithmetic with a `python` tool that applies one operator.

Self-contained (the test suite of `agents/` should not depend on which env modules exist), yet a normal
`ToolEnv`: tag actions, a declared tool, a verifier, a scripted expert.
"""

from __future__ import annotations

import operator
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from trace_gym import TagParser, Task, Tool, ToolEnv

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def python(code: str) -> str:
    """Evaluate one integer operation such as 12+7.

    code: the expression, two integers and one of + - *
    """
    m = re.fullmatch(r"\s*(-?\d{1,6})\s*([+\-*])\s*(-?\d{1,6})\s*", code)
    if m is None:
        return "Error: expected <int><op><int>"
    return str(OPS[m[2]](int(m[1]), int(m[3])))


def make_tasks(split: str, n: int, digits: int) -> list[Task]:
    """Up to `n` tasks of the split; a task id is in "test" iff its character sum is divisible by 5."""
    rng = random.Random(digits)
    ids = [f"{a}{op}{b}" for a in range(10**digits) for b in range(10**digits) for op in sorted(OPS)]
    rng.shuffle(ids)
    chosen = [t for t in ids if (split == "test") == (sum(map(ord, t)) % 5 == 0)][:n]
    return [Task(id=t, prompt=f"What is {t.replace('+', ' + ').replace('-', ' - ').replace('*', ' * ')}?",
                 answer=python(t)) for t in chosen]


class CalcEnv(ToolEnv):
    system_prompt = "Compute with the tool."

    def __init__(self, split: str = "train", n: int = 1000, digits: int = 1, max_turns: int = 3, **kw: Any):
        super().__init__(tasks=make_tasks(split, n, digits), max_turns=max_turns, parser=TagParser(), **kw)

    def tools(self) -> Sequence[Tool]:
        return [Tool.from_function(python)]

    def verify(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return float(answer.strip() == task.answer), {}

    def expert(self, noise: float = 0.0, seed: int = 0) -> CalcExpert:
        return CalcExpert()


class CalcExpert:
    def act(self, task: Task, messages: Sequence[Mapping[str, Any]]) -> str:
        if messages[-1]["role"] == "tool":
            return f"<answer>{messages[-1]['content']}</answer>"
        return f"<python>{task.id}</python>"
