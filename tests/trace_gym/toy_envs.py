"""Small real envs for testing the core: one draws from ``np_random`` inside tools, one keeps a counter."""

from __future__ import annotations

from typing import Any

from trace_gym import Task, Tool, ToolEnv, ToolError


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
        if not 1 <= sides <= 1000:
            raise ToolError(f"expected 1 to 1000 sides, got {sides}")
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


class InventoryEnv(ToolEnv):
    """The README's plug-in shape with a stock that tools change, and no ``example_actions``: what a new user
    writes. ``episode_fields`` is right here; the tests break it on purpose."""

    episode_fields: tuple[str, ...] = ("stock",)

    def load_tasks(self) -> list[Task]:
        return [Task(id="widgets", prompt="The shop holds 10 widget and 4 gadget. Sell some, then say how many "
                                          "widget are left.", answer=None)]

    def begin(self, task: Task) -> str:
        self.stock = {"widget": 10, "gadget": 4}
        return super().begin(task)

    def tools(self) -> list[Tool]:
        return [Tool.from_function(self.sell), Tool.from_function(self.count)]

    def sell(self, item: str, n: int) -> str:
        """Sell ``n`` of an item."""
        if item not in self.stock:
            return f"no item {item!r}"
        self.stock[item] = max(0, self.stock[item] - n)
        return f"sold; {self.stock[item]} {item} left"

    def count(self, item: str) -> str:
        """How many of an item are in stock."""
        return str(self.stock.get(item, 0))

    def verify(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return float(answer.strip() == str(self.stock["widget"])), {}


class Stock:
    """State held in an object: the snapshot check compares objects by identity, so only playing finds it."""

    def __init__(self) -> None:
        self.widget = 10

    def __deepcopy__(self, memo: dict[int, Any]) -> Stock:
        copied = Stock()
        copied.widget = self.widget
        return copied


class ObjectInventoryEnv(InventoryEnv):
    episode_fields = ()  # forgets "store"

    def begin(self, task: Task) -> str:
        self.store = Stock()
        self.stock = {}
        return ToolEnv.begin(self, task)

    def sell(self, item: str, n: int) -> str:
        """Sell ``n`` of an item."""
        self.store.widget -= n  # back orders: the count may go negative, so every sale shows
        return f"sold; {self.store.widget} left"

    def count(self, item: str) -> str:
        """How many of an item are in stock."""
        return str(self.store.widget)


class VaultEnv(ToolEnv):
    """State behind one valid argument: ``unlock(code)`` opens the vault only with the task's code, which the task
    text never shows (the expert knows it). A sound env declares ``opened``; ``leaky=True`` keeps it in a private
    attribute that native snapshots do not copy, a bug that only an episode that unlocks the vault can show."""

    episode_fields = ("opened",)

    def __init__(self, leaky: bool = False, **kwargs: Any):
        tasks = [Task(id=f"vault-{i}", prompt="Open the vault, then answer with what is inside.",
                      answer=f"gold-{i}", meta={"code": f"k{7919 * (i + 3) % 10007:05d}"}) for i in range(3)]
        super().__init__(tasks=tasks, max_turns=8, **kwargs)
        self.leaky = leaky
        self.opened = False
        self._opened = False

    def tools(self) -> list[Tool]:
        def unlock(code: str) -> str:
            """Try a code on the vault.

            code: the vault's code
            """
            assert self.task is not None
            if code != self.task.meta["code"]:
                return "wrong code"
            if self.leaky:
                self._opened = True
            else:
                self.opened = True
            return "the vault opens"

        def look() -> str:
            """Look inside the vault."""
            assert self.task is not None
            return self.task.answer if (self._opened if self.leaky else self.opened) else "the vault is closed"

        return [Tool.from_function(unlock), Tool.from_function(look)]

    def begin(self, task: Task) -> str:
        self.opened = self._opened = False
        return super().begin(task)

    def verify(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return float(answer.strip() == task.answer), {}

    def expert(self, noise: float = 0.0, seed: int = 0) -> VaultExpert:
        return VaultExpert(self.parser)


class VaultExpert:
    def __init__(self, parser: Any):
        self.parser = parser

    def act(self, task: Task, messages: Any) -> str:
        from trace_gym.tools import ToolCall

        said = [m.get("content", "") for m in messages if m.get("role") == "tool"]
        if "the vault opens" not in said:
            return self.parser.format(ToolCall("unlock", {"code": task.meta["code"]}))
        if not any(s.startswith("gold") for s in said):
            return self.parser.format(ToolCall("look", {}))
        return self.parser.format_answer(next(s for s in said if s.startswith("gold")))
