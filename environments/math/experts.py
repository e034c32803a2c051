"""Scripted experts for the math envs (the ``trace_gym.Expert`` protocol): SFT data and test drivers.

- ``ArithmeticExpert`` writes the task's expression as a cell, then answers with the tool's output. Noise:
  with probability ``noise`` one operand of the cell is off by one, so the answer is wrong. Guessing: with
  probability ``guess`` it answers at once without the tool (the gold answer, which an expert knows but a
  policy that copies the habit must compute in its head): SFT on such episodes teaches a policy to skip the
  tool in a share of episodes, a choice only the outcome shows to be wrong on hard prompts.
- ``ChainExpert`` (arithmetic chains, `chain.py`) computes one statement per call, the previous result copied
  from the chat into the call, then answers the last result. Noise: with probability ``noise`` a call's
  operand from the prompt is off by one. Guessing: with probability ``guess`` it answers the gold value after
  ``guess_after`` calls instead of finishing the chain, so the habit a warm start copies is a decision taken
  after the first turn, not at it.
- ``MathExpert`` (real datasets) computes the gold answer in a cell, then answers it. Noise: with probability
  ``noise`` it answers a wrong value instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trace_gym.actions import ActionParser, HermesParser, TagParser
from trace_gym.errors import ConfigError
from trace_gym.tasks import Task
from trace_gym.tools import ToolCall


class _Expert:
    def __init__(self, action_format: str = "tags", noise: float = 0.0, seed: int = 0):
        self.action_format, self.noise = action_format, noise
        # the env checked action_format; the experts import no env module (the envs import them)
        self.parser: ActionParser = HermesParser() if action_format == "hermes" else TagParser()
        self.rng = np.random.default_rng(seed)

    def call(self, code: str) -> str:
        return self.parser.format(ToolCall("python", {"code": code}))

    def answer(self, text: str) -> str:
        return self.parser.format_answer(text)

    @staticmethod
    def last_tool_output(messages: Sequence[Mapping[str, Any]]) -> str | None:
        if messages and messages[-1].get("role") == "tool":
            return str(messages[-1].get("content", ""))
        return None


class ArithmeticExpert(_Expert):
    """Expression cell, then the printed value as the answer; or, with probability ``guess``, the answer at once.

    ``guess_tiers`` limits guessing to tasks whose ``meta["tier"]`` is listed (None: every task).
    """

    def __init__(self, action_format: str = "tags", noise: float = 0.0, seed: int = 0, guess: float = 0.0,
                 guess_tiers: Sequence[str] | None = None):
        super().__init__(action_format, noise, seed)
        if not 0.0 <= guess <= 1.0:
            raise ConfigError(f"expected 0 <= guess <= 1, got {guess!r}; fix: guess=0.3")
        self.guess = guess
        self.guess_tiers = None if guess_tiers is None else frozenset(str(t) for t in guess_tiers)

    def act(self, task: Task, messages: Sequence[Mapping[str, Any]]) -> str:
        output = self.last_tool_output(messages)
        if output is not None:
            lines = output.strip().splitlines()
            return self.answer(lines[-1].strip() if lines else "")
        if self._guesses(task):
            return self.answer(str(task.answer))
        expr = str(task.meta.get("expression", task.answer))
        if self.noise > 0 and self.rng.random() < self.noise:
            nums = list(re.finditer(r"\d+", expr))
            m = nums[int(self.rng.integers(len(nums)))]
            expr = expr[: m.start()] + str(int(m.group()) + 1) + expr[m.end():]
        return self.call(f"print({expr})")

    def _guesses(self, task: Task) -> bool:
        if self.guess <= 0.0 or (self.guess_tiers is not None and task.meta.get("tier") not in self.guess_tiers):
            return False
        return bool(self.rng.random() < self.guess)


_RESULT = re.compile(r"\s*([a-z])\s*=\s*(-?\d+)\s*")
_TERM = re.compile(r"\d+|[a-z]|[-+*]")


class ChainExpert(_Expert):
    """One ``calc`` call per statement of the chain, then the last value (module docstring).

    Progress is read from the chat: the last tool message of the form ``name=value`` says which statement is
    done and its value (the value as the chat has it, so from a restored prefix with a slip it continues the
    chat, as a policy would). ``guess_tiers`` limits guessing to tasks whose ``meta["tier"]`` is listed.
    """

    def __init__(self, action_format: str = "tags", noise: float = 0.0, seed: int = 0, guess: float = 0.0,
                 guess_tiers: Sequence[str] | None = None, guess_after: int = 1):
        super().__init__(action_format, noise, seed)
        if not 0.0 <= guess <= 1.0:
            raise ConfigError(f"expected 0 <= guess <= 1, got {guess!r}; fix: guess=0.5")
        if guess_after < 1:
            raise ConfigError(f"expected guess_after >= 1 (calls before a guess), got {guess_after}")
        self.guess, self.guess_after = guess, guess_after
        self.guess_tiers = None if guess_tiers is None else frozenset(str(t) for t in guess_tiers)

    def act(self, task: Task, messages: Sequence[Mapping[str, Any]]) -> str:
        statements = [(str(n), str(rhs), int(v)) for n, rhs, v in task.meta["statements"]]
        names = [s[0] for s in statements]
        done, value = 0, None
        for message in reversed(messages):
            if message.get("role") == "tool":
                m = _RESULT.fullmatch(str(message.get("content", "")))
                if m is not None and m.group(1) in names:
                    done, value = names.index(m.group(1)) + 1, int(m.group(2))
                    break
        if done == len(statements):
            return self.answer(str(value))
        if done == self.guess_after and self._guesses(task):
            return self.answer(str(task.answer))
        name, rhs, _ = statements[done]
        operands = _TERM.findall(rhs)
        if self.noise > 0 and self.rng.random() < self.noise:
            slots = [i for i, t in enumerate(operands) if t.isdigit()]
            i = slots[int(self.rng.integers(len(slots)))]
            operands[i] = str(int(operands[i]) + 1)
        if done > 0:  # the previous statement's name becomes its value, as the chat shows it
            operands = [str(value) if t == names[done - 1] else t for t in operands]
        return self.call_calc(f"{name}={''.join(operands)}")

    def call_calc(self, expression: str) -> str:
        from trace_gym.tools import ToolCall

        return self.parser.format(ToolCall("calc", {"expression": expression}))

    def _guesses(self, task: Task) -> bool:
        if self.guess <= 0.0 or (self.guess_tiers is not None and task.meta.get("tier") not in self.guess_tiers):
            return False
        return bool(self.rng.random() < self.guess)


class MathExpert(_Expert):
    """Gold answer computed in a cell (as a string literal), then answered."""

    def act(self, task: Task, messages: Sequence[Mapping[str, Any]]) -> str:
        output = self.last_tool_output(messages)
        gold = str(task.answer)
        if output is None:
            return self.call(f"answer = {gold!r}\nprint(answer)")
        if self.noise > 0 and self.rng.random() < self.noise:
            return self.answer(_wrong(gold))
        lines = output.strip().splitlines()
        return self.answer(lines[-1] if lines else gold)


def _wrong(gold: str) -> str:
    try:
        return str(int(gold) + 1)
    except ValueError:
        return gold + "+1"
