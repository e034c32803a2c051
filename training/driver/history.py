"""What a training run accumulates across steps: held-out evaluations, effective ratios, budget spent. Kept in
checkpoints as a plain dict (`to_dict`), so that a resumed run goes on from it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunHistory:
    """The trainer's record across steps (`Trainer.summary` reads it)."""

    eval: list[tuple[int, float]] = field(default_factory=list)
    """(step, held-out success) of every evaluation."""
    eval_tool_use: list[tuple[int, float]] = field(default_factory=list)
    """(step, share of held-out episodes that called a tool) of every evaluation."""
    effective_ratio: list[float] = field(default_factory=list)
    """Each step's `alloc/effective_ratio` (nan where the step had none)."""
    trajectories: int = 0
    """Trajectories rolled out so far."""
    tokens: int = 0
    """Tokens generated so far."""
    eval_first: dict[str, list[float]] | None = None
    """Per-prompt values of the run's first evaluation (step 0), by measure: the baseline of the paired gain."""
    eval_last: dict[str, list[float]] | None = None
    """Per-prompt values of the latest evaluation, by measure."""

    def add_step(self, effective_ratio: float, trajectories: int, tokens: int) -> None:
        self.effective_ratio.append(effective_ratio)
        self.trajectories += trajectories
        self.tokens += tokens

    def add_eval(self, step: int, success: float, tool_use: float, per_prompt: dict[str, list[float]]) -> None:
        self.eval.append((step, success))
        self.eval_tool_use.append((step, tool_use))
        if step == 0:  # the run's baseline (a resumed run keeps its own from the checkpoint)
            self.eval_first = per_prompt
        self.eval_last = per_prompt

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunHistory:
        """The history ``to_dict`` gave ``data``; keys an older checkpoint lacks keep their defaults."""
        known = {f.name for f in dataclasses.fields(cls)}
        out = cls(**{k: v for k, v in data.items() if k in known})
        out.eval = [tuple(e) for e in out.eval]  # type: ignore[misc]
        out.eval_tool_use = [tuple(e) for e in out.eval_tool_use]  # type: ignore[misc]
        return out
