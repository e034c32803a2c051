"""Allocators: TRACE and its baselines in one two-stage frame (docs/design.md, "Allocators").

Stage 1 gives candidate prompts m_i bare rollouts; stage 2 gives each prompt's open prefixes (non-terminal
nodes of depth >= 1 on its bare rollouts) K continuations from a budget of m_i·N. Every allocator spends
exactly T = M·(1 + N) trajectories per step (a bare rollout and a continuation count 1 each).

Deviations and choices where the paper is silent:
1. Single-stage baselines (``grpo``, ``pcl``) spend all of T as bare rollouts: T // G prompts with G each,
   the remainder spread one by one over the chosen prompts (so a prompt may get G + 1).
2. Uniform roots choose prompts from the candidate pool uniformly without replacement; ``pcl`` chooses the
   prompts whose predicted success is nearest 0.5 (ties in random order).
3. Uniform prefixes (``treepo``) send each continuation to a uniformly random open prefix (multinomial).
4. A prompt with no open prefix (every bare rollout ended after one turn) spends its stage-2 budget as
   extra rollouts from the root (``expand_counts`` reports them as ``root_extra``).
5. Active roots cap a prompt at ``cap`` rollouts (default 16) so that the pool, not one prompt, absorbs M.
6. ``oracle`` is ``trace`` fed true success probabilities by the caller (simulation only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import numpy as np

from trace_gym.errors import ConfigError

from .allocation import solve_prefixes, solve_roots

RootMode = Literal["uniform", "active", "pcl"]
PrefixMode = Literal["none", "uniform", "active"]
AllocatorName = Literal["trace", "grpo", "pcl", "treepo", "uniform_uniform", "uniform_active", "active_uniform",
                        "active_active", "oracle"]
ALLOCATORS: tuple[str, ...] = get_args(AllocatorName)


@dataclass(frozen=True)
class StepBudget:
    """Trajectories per step: ``roots`` M bare rollouts plus ``multiplier`` N continuations per rollout."""

    roots: int  # M
    multiplier: int  # N

    def __post_init__(self) -> None:
        if self.roots < 2 or self.multiplier < 0:
            raise ConfigError(f"expected roots >= 2 and multiplier >= 0, got M={self.roots}, N={self.multiplier}")

    @property
    def total(self) -> int:
        return self.roots * (1 + self.multiplier)


class Allocator(Protocol):
    """Contract: for a ``StepBudget`` the root counts sum to ``root_budget(budget)``, each 0 or >= 2; the
    prefix counts of a prompt with m_i roots sum to ``prefix_budget(m_i, budget)``; so Σ = budget.total.
    ``needs_root_values``/``needs_prefix_values`` tell the caller whether to run the predictor (or, when
    ``oracle``, the environment's true values) before each stage."""

    name: str
    oracle: bool
    needs_root_values: bool
    needs_prefix_values: bool

    def root_budget(self, budget: StepBudget) -> int: ...

    def prefix_budget(self, m: int, budget: StepBudget) -> int: ...

    def allocate_roots(self, values: np.ndarray, budget: int, rng: np.random.Generator) -> dict[int, int]:
        """{pool index: m_i > 0}; ``values``: (pool,) success estimates (ignored by uniform roots)."""
        ...

    def allocate_prefixes(self, rewards: np.ndarray, values: np.ndarray, budget: int,
                          rng: np.random.Generator) -> np.ndarray:
        """(P,) continuation counts for P >= 1 open prefixes; ``rewards``: reward of each prefix's rollout."""
        ...


@dataclass(frozen=True)
class StagedAllocator:
    """One allocator per (stage-1 mode, stage-2 mode); see ``ALLOCATORS`` for the named ones."""

    name: str
    roots: RootMode
    prefixes: PrefixMode
    oracle: bool = False
    group_size: int = 8  # G: rollouts per prompt for uniform and pcl roots
    cap: int = 16  # most rollouts per prompt for active roots

    def __post_init__(self) -> None:
        if self.group_size < 2 or self.cap < 2:
            raise ConfigError(f"expected group_size >= 2 and cap >= 2, got {self.group_size}, {self.cap}")

    @property
    def needs_root_values(self) -> bool:
        return self.roots != "uniform"

    @property
    def needs_prefix_values(self) -> bool:
        return self.prefixes == "active"

    def root_budget(self, budget: StepBudget) -> int:
        return budget.roots if self.prefixes != "none" else budget.total

    def prefix_budget(self, m: int, budget: StepBudget) -> int:
        return m * budget.multiplier if self.prefixes != "none" else 0

    def allocate_roots(self, values: np.ndarray, budget: int, rng: np.random.Generator) -> dict[int, int]:
        values = np.asarray(values, dtype=np.float64)
        n_pool = len(values)
        if self.roots == "active":
            m = solve_roots(np.clip(values, 0.0, 1.0), budget, self.cap)
            return {int(i): int(m[i]) for i in np.flatnonzero(m)}
        if budget < 2:
            raise ConfigError(f"expected a root budget >= 2, got {budget}; fix: raise M")
        n = max(1, budget // self.group_size)
        if n > n_pool:
            raise ConfigError(f"expected a candidate pool of at least {n} prompts for {budget} rollouts in "
                              f"groups of {self.group_size}, got {n_pool}; fix: enlarge the pool or group_size")
        if self.roots == "uniform":
            chosen = rng.choice(n_pool, size=n, replace=False)
        else:  # pcl: nearest 0.5, random order among ties
            order = rng.permutation(n_pool)
            chosen = order[np.argsort(np.abs(values[order] - 0.5), kind="stable")[:n]]
        counts = np.full(n, budget // n)
        counts[: budget - counts.sum()] += 1
        return {int(i): int(c) for i, c in zip(chosen, counts)}

    def allocate_prefixes(self, rewards: np.ndarray, values: np.ndarray, budget: int,
                          rng: np.random.Generator) -> np.ndarray:
        p = len(rewards)
        if self.prefixes == "none" or budget == 0:
            if budget:
                raise ConfigError(f"expected no prefix budget for {self.name!r}, got {budget}")
            return np.zeros(p, dtype=np.int64)
        if p == 0:
            raise ConfigError("expected at least one open prefix; fix: call expand_counts, which sends the "
                              "budget to the root")
        if self.prefixes == "uniform":
            return rng.multinomial(budget, np.full(p, 1.0 / p)).astype(np.int64)
        return solve_prefixes(np.asarray(rewards, float), np.clip(np.asarray(values, float), 0.0, 1.0), budget)


def expand_counts(allocator: Allocator, rewards: np.ndarray, values: np.ndarray, budget: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """(counts per open prefix, extra root rollouts): the root takes the budget when no prefix is open."""
    if len(rewards) == 0:
        return np.zeros(0, dtype=np.int64), budget
    return allocator.allocate_prefixes(rewards, values, budget, rng), 0


_MODES: dict[str, tuple[RootMode, PrefixMode, bool]] = {  # one entry per name of AllocatorName
    "trace": ("active", "active", False),
    "grpo": ("uniform", "none", False),
    "pcl": ("pcl", "none", False),
    "treepo": ("uniform", "uniform", False),
    "uniform_uniform": ("uniform", "uniform", False),
    "uniform_active": ("uniform", "active", False),
    "active_uniform": ("active", "uniform", False),
    "active_active": ("active", "active", False),
    "oracle": ("active", "active", True),
}


def make_allocator(name: str, group_size: int = 8, cap: int = 16) -> StagedAllocator:
    """A named allocator: one of ``ALLOCATORS``."""
    if name not in ALLOCATORS:
        raise ConfigError(f"expected an allocator in {ALLOCATORS}, got {name!r}")
    roots, prefixes, oracle = _MODES[name]
    return StagedAllocator(name, roots, prefixes, oracle, group_size, cap)
