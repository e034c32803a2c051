"""Small real envs for testing the core: one draws from ``np_random`` inside tools, one keeps a counter."""

from __future__ import annotations

from typing import Any

from trace_gym import Task, Tool, ToolEnv


class DiceEnv(ToolEnv):
    """Roll dice with the env's RNG and answer the running total: RNG state and a counter are episode state."""

    episode_fields = ("total", "rolls")

    def __init__(self, n_tasks: int = 5, **kwargs: Any):
        tasks = [Task(id=f"dice-{i}", prompt=f"Roll {i + 2} dice and report the total.", answer=i + 2)
                 for i in range(n_tasks)]
        super().__init__(tasks=tasks, **kwargs)
        self.total = 0
        self.rolls = 0

    def begin(self, task: Task) -> str:
        self.total, self.rolls = 0, 0
        return super().begin(task)

    def tools(self) -> list[Tool]:
        return [Tool.from_function(self.roll), Tool.from_function(self.add)]

    def roll(self, sides: int = 6) -> str:
        """Roll one die.

        sides: number of faces
        """
        if sides < 1:
            raise ValueError("a die needs at least one side")
        value = int(self.np_random.integers(1, sides + 1))
        self.total += value
        self.rolls += 1
        return f"rolled {value}; total {self.total}"

    def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    def verify(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        ok = self.rolls == task.answer and answer.strip() == str(self.total)
        return float(ok), {"total": self.total, "rolls": self.rolls}

    def example_actions(self) -> list[str]:
        return ['<tool_call>{"name": "roll", "arguments": {"sides": 6}}</tool_call>',
                '<tool_call>{"name": "roll", "arguments": {}}</tool_call><tool_call>{"name": "add", '
                '"arguments": {"a": 1, "b": 2}}</tool_call>',
                f"<answer>{self.total}</answer>"]
