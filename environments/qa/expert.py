"""Scripted expert for multi-hop QA: search each supporting-fact title, then answer with the gold answer.

Protocol (``trace_gym.experts.Expert``): ``act(task, messages) -> str``, where ``messages`` are the env's
``info["messages"]``. Progress is read from the messages (which planned queries were already issued), so the
expert resumes correctly from any restored node of a rollout tree. Randomness comes from its own seeded
generator, advanced on every call, so branches from one node differ.

Noise: with probability ``noise`` a search turn queries a distractor title instead (a wasted turn; enough of
them truncate the episode) and the answer turn gives a wrong answer (reward 0 under the env's reward, and F1
below the success threshold against every gold answer).
Tasks without supporting facts (question lists, Bamboogle) search the question itself once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from trace_gym.actions import ActionParser, HermesParser, TagParser
from trace_gym.environments.qa.metrics import normalize_answer, qa_reward, score_answer
from trace_gym.errors import ConfigError
from trace_gym.tasks import Task
from trace_gym.tools import ToolCall

__all__ = ["QAExpert", "issued_queries", "search_turn"]

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_SEARCH_TAG = re.compile(r"<search>(.*?)</search>", re.DOTALL)


def search_turn(parser: ActionParser, query: str) -> str:
    """A turn that searches ``query``, in the parser's format."""
    return parser.format(ToolCall("search", {"query": query}))


def issued_queries(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Search queries found in the assistant turns so far (both action formats)."""
    out: list[str] = []
    for m in messages:
        if m.get("role") != "assistant":
            continue
        content = str(m.get("content", ""))
        for body in _TOOL_CALL.findall(content):
            try:
                call = json.loads(body)
            except json.JSONDecodeError:
                continue
            if isinstance(call, dict) and isinstance(call.get("arguments"), dict):
                out.append(str(call["arguments"].get("query", "")))
        out.extend(q.strip() for q in _SEARCH_TAG.findall(content))
    return out


class QAExpert:
    """Solves a QA task from its gold answer and supporting titles, with a noise knob."""

    def __init__(self, noise: float = 0.0, seed: int = 0, action_format: Literal["hermes", "tags"] = "hermes",
                 reward: str = "em", success_f1: float = 0.3):
        if not 0.0 <= noise <= 1.0:
            raise ConfigError(f"expected noise in [0, 1], got {noise}")
        if action_format not in ("hermes", "tags"):
            raise ConfigError(f"expected action_format 'hermes' or 'tags', got {action_format!r}")
        self.noise = noise
        self.action_format = action_format
        self.parser: ActionParser = HermesParser() if action_format == "hermes" else TagParser()
        self.reward, self.success_f1 = reward, success_f1
        self.rng = np.random.default_rng(seed)

    def plan(self, task: Task) -> list[str]:
        """The queries a perfect run issues, in order."""
        titles = list(task.meta.get("supporting_titles", []))
        return titles if titles else [task.prompt]

    def act(self, task: Task, messages: Sequence[Mapping[str, Any]]) -> str:
        done = set(issued_queries(messages))
        todo = [q for q in self.plan(task) if q not in done]
        noisy = self.noise > 0 and self.rng.random() < self.noise
        if todo:
            query = self._distractor_query(task) if noisy else todo[0]
            return search_turn(self.parser, query)
        golds = [str(a) for a in (task.answer or [])]
        answer = self._wrong_answer(task, golds) if noisy else (golds[0] if golds else "")
        return self.parser.format_answer(answer)

    def _distractor_query(self, task: Task) -> str:
        support = set(task.meta.get("supporting_titles", []))
        others = [t for t in task.meta.get("titles", []) if t not in support]
        if others:
            return others[int(self.rng.integers(len(others)))]
        words = task.prompt.split()
        return " ".join(self.rng.permutation(words)[:2]) if words else "unknown"

    def _wrong_answer(self, task: Task, golds: list[str]) -> str:
        norm = {normalize_answer(g) for g in golds}
        if norm & {"yes", "no"}:
            return "no" if "yes" in norm else "yes"
        candidates = [t for t in task.meta.get("titles", []) if self._wrong(t, golds)]
        if candidates:
            return candidates[int(self.rng.integers(len(candidates)))]
        for fallback in ("unknown", "none of them", "42"):
            if self._wrong(fallback, golds):
                return fallback
        return ""

    def _wrong(self, answer: str, golds: list[str]) -> bool:
        scores = score_answer(answer, golds, self.success_f1)
        return qa_reward(self.reward, scores) == 0.0 and scores["accuracy"] == 0.0
