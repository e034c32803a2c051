"""Scripted BFCL expert: plays the ground truth, with a noise knob that drops, reorders or perturbs a call.

Protocol (trace_gym.experts.Expert): `act(task, messages) -> str`, where `messages` is the env's
`info["messages"]`. Multi-turn: in the first steps of each user turn it sends that turn's ground-truth calls,
`max_calls_per_step` per step (the env's limit), in one Python-call list (or Hermes blocks) per step, then
replies in plain text, which ends the user turn.
Single-turn: one answer with a first acceptable value per parameter (irrelevance: a plain-text refusal).
With probability `noise` per turn it corrupts the turn's calls with one of `corruptions`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from trace_gym.actions import HermesParser
from trace_gym.environments.bfcl.backends import MAX_CALLS_PER_STEP, keyword_call
from trace_gym.environments.bfcl.calls import Call, parse_ground_truth_call, to_python_call
from trace_gym.tasks import Task
from trace_gym.tools import ToolCall

Corruption = Literal["drop", "reorder", "perturb"]
DONE = "The request has been handled."


def _first_choice(choices: Any) -> Any:
    """A value the AST checker accepts from a possible-answer list (nested dicts hold lists again)."""
    value = choices[0] if isinstance(choices, list) and choices else choices
    if isinstance(value, dict):
        return {k: _first_choice(v) for k, v in value.items() if not (isinstance(v, list) and v and v[0] == "")}
    if isinstance(value, list):
        return [_first_choice([v]) if isinstance(v, dict) else v for v in value]
    return value


def single_turn_calls(ground_truth: Sequence[Mapping[str, Any]],
                      functions: Sequence[Mapping[str, Any]]) -> list[Call]:
    """One correct answer of a single-turn entry: ground truth {func: {param: [acceptable values]}}.

    `""` among the values means "may be omitted": omitted unless the doc requires the parameter."""
    required = {f["name"]: set(f.get("parameters", {}).get("required", [])) for f in functions}
    calls = []
    for item in ground_truth:
        for name, params in item.items():
            args = {}
            for p, values in params.items():
                if "" in values and p not in required.get(name, ()):
                    continue
                args[p] = _first_choice([v for v in values if v != ""])
            calls.append(Call(name, args))
    return calls


def perturb_value(value: Any) -> Any:
    """A different value of the same kind (so schema checks still pass and only the outcome changes)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 7
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list | tuple):
        return type(value)([*value, value[0]]) if value else type(value)(["x"])
    if isinstance(value, dict):
        return {**value, "extra_key": 1}
    return "x"


class BFCLExpert:
    """Ground-truth player for BFCLMultiTurnEnv and BFCLSingleTurnEnv tasks."""

    def __init__(self, noise: float = 0.0, seed: int = 0, style: Literal["python", "hermes"] = "python",
                 corruptions: Sequence[Corruption] = ("drop", "reorder", "perturb"),
                 max_calls_per_step: int = MAX_CALLS_PER_STEP):
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"expected noise in [0, 1], got {noise}; fix: pass a probability")
        if max_calls_per_step < 1:
            raise ValueError(f"expected max_calls_per_step >= 1, got {max_calls_per_step}")
        self.max_calls_per_step = max_calls_per_step
        self._turn: tuple[str, int, list[Call]] = ("", -1, [])  # (task id, user turn, the calls planned for it)
        if style not in ("python", "hermes"):
            raise ValueError(f"expected style 'python' or 'hermes', got {style!r}")
        self.noise, self.style, self.corruptions = noise, style, tuple(corruptions)
        self.rng = np.random.default_rng(seed)

    def act(self, task: Task, messages: Sequence[Mapping[str, Any]]) -> str:
        if task.meta.get("category") == "irrelevance":
            return "None of the available functions can answer this."
        if "initial_config" not in task.meta:  # single-turn
            return self.render(self.corrupt(single_turn_calls(task.answer, task.meta["function"])))
        turn, step = self._position(messages)
        if step == 0:  # the turn's calls, corrupted once per turn, then sent a step's share at a time
            decoded = self._ground_truth(task, turn)
            self._turn = (task.id, turn, self.corrupt(decoded) if decoded else [])
        # A later step of another turn than the last planned (a branch of a tree): its clean calls.
        planned = self._turn[2] if self._turn[:2] == (task.id, turn) else self._ground_truth(task, turn)
        k = self.max_calls_per_step
        share = planned[step * k:(step + 1) * k]
        return self.render(share) if share else DONE

    def _ground_truth(self, task: Task, turn: int) -> list[Call]:
        decoded = [parse_ground_truth_call(c) for c in (task.answer[turn] if turn < len(task.answer) else [])]
        if self.style == "hermes":  # JSON has no positional arguments: name them from the method signature
            decoded = [keyword_call(task.meta["involved_classes"], c) for c in decoded]
        return decoded

    @staticmethod
    def _position(messages: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
        """(user turn index, assistant steps already taken in it) from the chat so far."""
        turn, steps, previous = -1, 0, None
        for m in messages:
            role = m.get("role")
            if role == "user" and previous != "user":  # consecutive user messages form one turn
                turn, steps = turn + 1, 0
            elif role == "assistant":
                steps += 1
            previous = role
        return max(turn, 0), steps

    def corrupt(self, calls: list[Call]) -> list[Call]:
        if not calls or self.noise == 0.0 or self.rng.random() >= self.noise:
            return calls
        kind = self.corruptions[int(self.rng.integers(len(self.corruptions)))]
        i = int(self.rng.integers(len(calls)))
        if kind == "drop":
            return calls[:i] + calls[i + 1:]
        if kind == "reorder" and len(calls) > 1:
            calls = list(calls)
            calls.reverse()
            return calls
        call = calls[i]
        if call.arguments:
            key = sorted(call.arguments)[int(self.rng.integers(len(call.arguments)))]
            changed = Call(call.name, {**call.arguments, key: perturb_value(call.arguments[key])}, call.positional)
        elif call.positional:
            changed = Call(call.name, {}, (perturb_value(call.positional[0]), *call.positional[1:]))
        else:
            return calls[:i] + calls[i + 1:]  # nothing to perturb: drop it instead
        return [*calls[:i], changed, *calls[i + 1:]]

    def render(self, calls: Sequence[Call]) -> str:
        if not calls:
            return DONE
        if self.style == "hermes":  # keyword calls only (act named the positional arguments)
            return HermesParser().format(*(ToolCall(c.name, c.arguments) for c in calls))
        return "[" + ", ".join(to_python_call(c) for c in calls) + "]"
