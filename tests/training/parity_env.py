"""A two-turn text env that rewards any final action of even length: random tiny models get mixed outcomes,
so training tests see non-zero advantages without a warm start."""

from __future__ import annotations

from typing import Any

from trace_gym import Task, TextEnv, Turn


class ParityEnv(TextEnv):
    """Turn 1 gets an observation; turn 2 ends the episode with reward 1 when the action has even length."""

    def __init__(self, n_tasks: int = 12, task_seed: int = 0, **kwargs: Any):
        tasks = [Task(id=f"p{task_seed}-{i}", prompt=f"Say something, then something of even length ({i}).",
                      answer="even") for i in range(n_tasks)]
        super().__init__(tasks=tasks, max_turns=3, **kwargs)

    def turn(self, action: str) -> Turn:
        if self.turn_count < 2:
            return Turn(f"noted {len(action) % 7}")
        return Turn("", reward=float(len(action) % 2 == 0), terminated=True, info={"stop_reason": "answer"},
                    messages=[])


ENTRY_POINT = f"{__name__}:ParityEnv"
