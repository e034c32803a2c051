"""The unit of an episode: one task (prompt plus gold answer)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One prompt of a dataset. ``answer`` and ``meta`` are JSON-serialisable and env-specific."""

    id: str
    prompt: str
    answer: Any = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The task as a JSON-ready dict."""
        return {"id": self.id, "prompt": self.prompt, "answer": self.answer, "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Task:
        """The task that ``to_dict()`` gave ``d``."""
        return cls(id=str(d["id"]), prompt=str(d["prompt"]), answer=d.get("answer"), meta=d.get("meta", {}))
