"""The simulation's synthetic task (training/simulation.py) as a ``TextEnv``, for the conformance checker and
the tests that play it turn by turn; the simulation itself plays it on trees directly (`SimCollector`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trace_gym.env import TextEnv, Turn
from trace_gym.tasks import Task
from trace_gym.training.simulation import BAD_ACTION, GOOD_ACTION, _is_good, make_tasks, move, value_at


class SimEnv(TextEnv):
    """The synthetic task as a ``TextEnv``: an action containing "safe path" is a good move."""

    episode_fields = ("moves", "good")

    def __init__(self, tasks: Sequence[Task] | None = None, n_tasks: int = 64, horizon: int = 4, seed: int = 0,
                 render_mode: str | None = None):
        super().__init__(tasks if tasks is not None else make_tasks(n_tasks, horizon, seed),
                         max_turns=horizon, render_mode=render_mode)
        self.moves = 0
        self.good = 0

    def begin(self, task: Task) -> str:
        self.moves, self.good = 0, 0
        self.messages = [{"role": "user", "content": task.prompt}]
        return task.prompt

    def turn(self, action: str) -> Turn:
        assert self.task is not None
        is_good = _is_good(action)
        obs, reward, terminated, self.moves, self.good = move(self.task, self.moves, self.good, is_good)
        info: dict[str, Any] = {} if is_good else {"error": "dead end"}
        if terminated:
            info["stop_reason"] = "answer"
        return Turn(obs, reward, terminated, info)

    def example_actions(self) -> list[str]:
        return [GOOD_ACTION.format(t=self.moves + 1), BAD_ACTION.format(t=self.moves + 1)]

    def true_value(self) -> float:
        """Exact success probability of the scripted policy from the current state."""
        assert self.task is not None
        return value_at(self.task, self.moves, self.good)
