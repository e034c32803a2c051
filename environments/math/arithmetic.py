"""A procedural arithmetic family that a tiny model can learn with the Python tool.

Each task is an integer expression over ``+ - *`` (or a word problem that encodes one). The intended solution
is ReAct: ``<python>print(expr)</python>`` -> tool output -> ``<answer>N</answer>``. Difficulty is the number
of operators and the operand size; see docs/measured.md ("The tiny model on Arithmetic"): 2-3 operators with
1-3 digit operands leave most prompts of a 0.8M-parameter model mixed after a short SFT.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.tasks import Task

_NAMES = ("Ann", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun")
_ITEMS = ("apples", "coins", "stamps", "marbles", "books", "shells", "cards", "pens")


@dataclass(frozen=True)
class ArithmeticConfig:
    """How hard the generated tasks are."""

    min_ops: int = 2
    """Fewest operators per expression."""
    max_ops: int = 3
    """Most operators per expression."""
    min_digits: int = 1
    """Fewest digits per operand."""
    max_digits: int = 3
    """Most digits per operand."""
    word_fraction: float = 0.25
    """Share of tasks phrased as word problems (those use + - * with one item kind)."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_ops <= self.max_ops:
            raise ConfigError(f"expected 1 <= min_ops <= max_ops, got {self.min_ops}, {self.max_ops}")
        if not 1 <= self.min_digits <= self.max_digits <= 9:
            raise ConfigError(f"expected 1 <= min_digits <= max_digits <= 9, got {self.min_digits}, {self.max_digits}")
        if not 0.0 <= self.word_fraction <= 1.0:
            raise ConfigError(f"expected word_fraction in [0, 1], got {self.word_fraction}")

    @classmethod
    def level(cls, difficulty: int) -> ArithmeticConfig:
        """Preset levels 1 (one operator, one digit) .. 5 (four operators, three digits)."""
        presets = {1: (1, 1, 1, 1), 2: (1, 2, 1, 2), 3: (2, 3, 1, 3), 4: (3, 3, 2, 3), 5: (4, 4, 3, 3)}
        if difficulty not in presets:
            raise ConfigError(f"expected difficulty in 1..5, got {difficulty}")
        lo, hi, dlo, dhi = presets[difficulty]
        return cls(min_ops=lo, max_ops=hi, min_digits=dlo, max_digits=dhi)


def _operand(rng: np.random.Generator, cfg: ArithmeticConfig) -> int:
    digits = int(rng.integers(cfg.min_digits, cfg.max_digits + 1))
    return int(rng.integers(10 ** (digits - 1) if digits > 1 else 0, 10**digits))


def make_task(rng: np.random.Generator, cfg: ArithmeticConfig, index: int) -> Task:
    """One task; its ``meta['expression']`` is the Python expression whose value is the answer."""
    n_ops = int(rng.integers(cfg.min_ops, cfg.max_ops + 1))
    if rng.random() < cfg.word_fraction:
        return _word_task(rng, cfg, n_ops, index)
    nums = [_operand(rng, cfg) for _ in range(n_ops + 1)]
    ops = [str(rng.choice(["+", "-", "*"])) for _ in range(n_ops)]
    expr = str(nums[0]) + "".join(f" {op} {n}" for op, n in zip(ops, nums[1:]))
    value = eval(expr, {"__builtins__": {}})  # digits and + - * only: built here, not from input
    return Task(id=f"arith-{index}", prompt=f"Compute {expr}.", answer=str(value),
                meta={"expression": expr, "ops": n_ops, "kind": "expression"})


def _word_task(rng: np.random.Generator, cfg: ArithmeticConfig, n_ops: int, index: int) -> Task:
    name, item = str(rng.choice(_NAMES)), str(rng.choice(_ITEMS))
    start = _operand(rng, cfg)
    expr, sentences = str(start), [f"{name} has {start} {item}."]
    for _ in range(n_ops):
        kind, n = int(rng.integers(3)), _operand(rng, cfg)
        if kind == 0:
            expr, text = f"{expr} + {n}", f"Then {name} finds {n} more."
        elif kind == 1:
            expr, text = f"{expr} - {n}", f"Then {name} gives away {n}."
        else:
            m = int(rng.integers(2, 10))
            expr, text = f"({expr}) * {m}", f"Then the number of {item} becomes {m} times as large."
        sentences.append(text)
    value = eval(expr, {"__builtins__": {}})
    prompt = " ".join(sentences) + f" How many {item} does {name} have now? (It may be negative.)"
    return Task(id=f"arith-{index}", prompt=prompt, answer=str(value),
                meta={"expression": expr, "ops": n_ops, "kind": "word"})


def make_tasks(n: int, cfg: ArithmeticConfig | None = None, seed: int = 0) -> list[Task]:
    """``n`` tasks, the same for the same ``cfg`` and ``seed``."""
    rng = np.random.default_rng(seed)
    cfg = cfg or ArithmeticConfig()
    return [make_task(rng, cfg, i) for i in range(n)]
