"""A procedural arithmetic family that a tiny model can learn with the Python tool.

Each task is an integer expression over ``+ - *`` (or a word problem that encodes one). The intended solution
is ReAct: ``<python>print(expr)</python>`` -> tool output -> ``<answer>N</answer>``. Difficulty is the number
of operators and the operand size; see docs/measured.md ("The tiny model on Arithmetic"): 2-3 operators with
1-3 digit operands leave most prompts of a 0.8M-parameter model mixed after a short SFT.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class Tier:
    """One difficulty tier of a mixed pool: its share of the tasks and its generator settings (an
    ``ArithmeticConfig``, or a ``chain.ChainConfig`` for the chain family)."""

    name: str
    share: float
    config: Any


def parse_tiers(tiers: Mapping[str, Mapping[str, Any]], config_cls: type = ArithmeticConfig) -> list[Tier]:
    """``{name: {share, <config_cls field>: value, ...}}`` (YAML's form) as tiers; the fields are those of
    ``config_cls`` (Arithmetic's: min_ops, max_ops, min_digits, max_digits, word_fraction)."""
    known = {f.name for f in dataclasses.fields(config_cls)}
    out = []
    for name, spec in tiers.items():
        if not isinstance(spec, Mapping) or "share" not in spec:
            raise ConfigError(f"expected tier {name!r} as a mapping with a share, got {spec!r}; "
                              "fix: tiers={easy: {share: 0.5, max_ops: 1}, hard: {share: 0.5, min_ops: 4}}")
        extra = set(spec) - known - {"share"}
        if extra:
            raise ConfigError(f"expected tier {name!r} keys among {sorted(known | {'share'})}, got {sorted(extra)}")
        share = float(spec["share"])
        if share <= 0:
            raise ConfigError(f"expected tier {name!r} share > 0, got {share}")
        out.append(Tier(str(name), share, config_cls(**{k: v for k, v in spec.items() if k != "share"})))
    if not out:
        raise ConfigError("expected at least one tier, got none; fix: leave tiers unset for one difficulty")
    return out


def make_tiered_tasks(n: int, tiers: Sequence[Tier], seed: int = 0,
                      make: Callable[[np.random.Generator, Any, int], Task] = make_task) -> list[Task]:
    """``n`` tasks drawn from ``tiers`` in proportion to their shares, shuffled; ``meta['tier']`` names each one's.
    ``make(rng, tier.config, index)`` builds one task (Arithmetic's `make_task` by default).

    Counts are the shares' largest-remainder rounding of ``n``, so a pool holds its tiers' shares exactly.
    """
    rng = np.random.default_rng(seed)
    total = sum(t.share for t in tiers)
    exact = [n * t.share / total for t in tiers]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(tiers)), key=lambda i: counts[i] - exact[i])[: n - sum(counts)]:
        counts[i] += 1
    order = rng.permutation(np.repeat(np.arange(len(tiers)), counts))
    tasks = []
    for index, k in enumerate(order):
        task = make(rng, tiers[int(k)].config, index)
        tasks.append(dataclasses.replace(task, meta={**task.meta, "tier": tiers[int(k)].name}))
    return tasks
