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
7. ``trace_adaptive`` (not in the paper) splits the root budget between trace's active roots and uniform
   groups by a trust weight it measures online (``AdaptiveAllocator``); ``trace`` stays the paper's.
8. The TRACE variants that change stage 2 (``trace_root``, ``trace_refund``, ``trace_plus``,
   ``trace_root_uniform``: root anchors, a refund to stage 1) live in training/variants.py, each registered here
   by name (`make_allocator`).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.training.allocation.solvers import solve_prefixes, solve_roots
from trace_gym.training.config import ALLOCATORS, StepBudget

RootMode = Literal["uniform", "active", "pcl"]
PrefixMode = Literal["none", "uniform", "active"]


class Allocator(Protocol):
    """Contract: for a ``StepBudget`` the root counts sum to ``root_budget(budget)``, each 0 or >= 2; the
    prefix counts of a prompt with m_i roots sum to ``prefix_budget(m_i, budget)``; so Σ = budget.total.
    ``needs_root_values``/``needs_prefix_values`` tell the caller whether to run the predictor (or, when
    ``oracle``, the environment's true values) before each stage."""

    @property
    def name(self) -> str: ...

    @property
    def oracle(self) -> bool: ...

    @property
    def needs_root_values(self) -> bool: ...

    @property
    def needs_prefix_values(self) -> bool: ...

    def root_budget(self, budget: StepBudget) -> int: ...

    def prefix_budget(self, m: int, budget: StepBudget) -> int: ...

    def allocate_roots(self, values: np.ndarray, budget: int, rng: np.random.Generator) -> dict[int, int]:
        """{pool index: m_i > 0}; ``values``: (pool,) success estimates (ignored by uniform roots)."""
        ...

    def allocate_prefixes(self, rewards: np.ndarray, values: np.ndarray, budget: int,
                          rng: np.random.Generator) -> np.ndarray:
        """(P,) continuation counts for P >= 1 open prefixes; ``rewards``: reward of each prefix's rollout."""
        ...

    def observe(self, trees: Mapping[int, Any]) -> dict[str, float]:
        """This step's finished trees ({pool index: RolloutTree}), before the predictor's fit; returns alloc/
        metrics. Stateless allocators ignore it."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


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
                raise ValueError(f"expected no prefix budget for {self.name!r}, got {budget}")
            return np.zeros(p, dtype=np.int64)
        if p == 0:
            raise ValueError("expected at least one open prefix; fix: call expand_counts, which sends the "
                              "budget to the root")
        if self.prefixes == "uniform":
            return rng.multinomial(budget, np.full(p, 1.0 / p)).astype(np.int64)
        return solve_prefixes(np.asarray(rewards, float), np.clip(np.asarray(values, float), 0.0, 1.0), budget)

    def observe(self, trees: Mapping[int, Any]) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        return None


def mixed_share(k: np.ndarray, n: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Unbiased estimate of 1 - p^m - (1-p)^m (the chance that m rollouts hold both outcomes) from k successes
    in n >= m rollouts: the share of m-subsets of the n outcomes that are mixed (hypergeometric)."""
    k, n, m = (np.asarray(x, dtype=np.int64) for x in (k, n, m))
    if np.any(m > n) or np.any(m < 0) or np.any((k < 0) | (k > n)):
        raise ValueError(f"expected 0 <= m <= n and 0 <= k <= n, got k={k}, n={n}, m={m}")
    comb = np.vectorize(math.comb, otypes=[np.float64])
    out = 1.0 - (comb(k, m) + comb(n - k, m)) / comb(n, m)
    return np.where(m == 0, 0.0, out)


def bare_rewards(tree: Any) -> list[float]:
    """The reward of each bare rollout of a ``RolloutTree`` (a root branch followed through its first-created
    children: continuations are added after the rollout they branch from, so they never come first)."""
    out = []
    for c in tree.root.children:
        node = tree[c]
        while node.children:
            node = tree[min(node.children)]
        out.append(float(node.reward))
    return out


class AdaptiveAllocator:
    """trace whose root stage leans on the predictor only as far as the predictor has earned (deviation 7).

    Each step the root budget M splits into an active part (trace's exact solver on the predicted values) of
    2·floor(w·M/2) rollouts and a uniform part: the rest in groups of ``group_size`` on prompts drawn at random
    from the pool. Stage 2 is trace's (active prefixes) for both. The trust w is measured on the uniform
    groups, which are an unbiased sample of the pool, against the active rule's per-prompt effective ratio.
    The active rule's ratio is estimated from two sources pooled: the prompts it actually chose (their trees
    mixed or not; the last ``window``), and, counterfactually, the choice it would have made among the last
    ``window`` uniform prompts by the values predicted for them before their outcomes were seen. A prompt
    given m roots (and so m·N continuations) is scored as m·(1 + N) fresh rollouts, capped at the group's
    size: `mixed_share` of its bare rollouts' outcomes (unbiased). In the simulation this equivalence holds:
    trace's chosen prompts were mixed in 0.758 of trees, against 0.754 expected for m·(1 + N) fresh rollouts
    (0.436 for the m roots alone). The second source exists from the first step on, so trust can be earned
    from zero.
    w = Φ(difference / its standard error), the probability that prediction-guided roots beat uniform groups
    here, capped at ``max_trust`` (default 1 - group_size/M: one uniform group per step keeps measuring). It
    starts at 0 (uniform roots, active prefixes: uniform_active) and stays there until ``min_records``
    uniform prompts are in.
    """

    oracle = False
    needs_root_values = True
    needs_prefix_values = True

    def __init__(self, name: str = "trace_adaptive", group_size: int = 8, cap: int = 16, window: int = 128,
                 min_records: int = 16, max_trust: float | None = None):
        if group_size < 2 or cap < 2 or window < 1 or min_records < 2:
            raise ConfigError(f"expected group_size, cap >= 2, window >= 1 and min_records >= 2, got "
                              f"{group_size}, {cap}, {window}, {min_records}")
        self.name, self.group_size, self.cap = name, group_size, cap
        self.window, self.min_records, self.max_trust = window, min_records, max_trust
        self._active = StagedAllocator(name, "active", "active", False, group_size, cap)
        self.trust = 0.0
        # Per uniform prompt: (predicted value, successes and count of its bare rollouts, whole tree mixed).
        self.records: list[tuple[float, int, int, float]] = []
        self.active_records: list[float] = []  # per prompt the active rule chose: its tree was mixed (1) or not
        self._pending: dict[int, float] = {}
        self._pending_active: set[int] = set()
        self._shape = (0, 0)  # (root budget, pool size) of the last step: the counterfactual's selection rate
        self._multiplier = 1  # N of the last step's budget

    def root_budget(self, budget: StepBudget) -> int:
        self._multiplier = budget.multiplier  # the counterfactual scores m roots as m·(1 + N) rollouts
        return budget.roots

    def prefix_budget(self, m: int, budget: StepBudget) -> int:
        return m * budget.multiplier

    def split(self, budget: int) -> tuple[int, int]:
        """(active, uniform) root rollouts for the current trust; uniform is 0 or >= 2."""
        cap = self.max_trust if self.max_trust is not None else 1.0 - self.group_size / max(budget, 1)
        w = min(self.trust, max(cap, 0.0))
        active = 2 * int(w * budget / 2)
        if budget - active == 1:  # never a lone uniform rollout (active is even, so >= 2 here)
            active -= 2
        return active, budget - active

    def allocate_roots(self, values: np.ndarray, budget: int, rng: np.random.Generator) -> dict[int, int]:
        values = np.asarray(values, dtype=np.float64)
        n_pool = len(values)
        active, uniform = self.split(budget)
        groups: dict[int, int] = {}
        if uniform:
            n = max(1, uniform // self.group_size)
            if n > n_pool:
                raise ConfigError(f"expected a pool of at least {n} prompts, got {n_pool}; fix: enlarge the pool")
            chosen = rng.choice(n_pool, size=n, replace=False)
            counts = np.full(n, uniform // n)
            counts[: uniform - counts.sum()] += 1
            groups = {int(i): int(c) for i, c in zip(chosen, counts)}
        out = dict(groups)
        if active:
            rest = np.array([i for i in range(n_pool) if i not in groups], dtype=np.int64)
            m = solve_roots(np.clip(values[rest], 0.0, 1.0), active, self.cap)
            out.update({int(rest[j]): int(m[j]) for j in np.flatnonzero(m)})
        self._pending = {i: float(values[i]) for i in groups}
        self._pending_active = set(out) - set(groups)
        self._shape = (budget, n_pool)
        return out

    def allocate_prefixes(self, rewards: np.ndarray, values: np.ndarray, budget: int,
                          rng: np.random.Generator) -> np.ndarray:
        return self._active.allocate_prefixes(rewards, values, budget, rng)

    def observe(self, trees: Mapping[int, Any]) -> dict[str, float]:
        """Records the step's finished trees ({pool index: RolloutTree}) and re-measures the trust."""
        for i, v in self._pending.items():
            if i in trees:
                r = np.array(bare_rewards(trees[i]))
                if len(r) >= 2:
                    self.records.append((v, int((r > 0).sum()), len(r), float(trees[i].is_mixed())))
        self.active_records += [float(trees[i].is_mixed()) for i in sorted(self._pending_active) if i in trees]
        self._pending, self._pending_active = {}, set()
        self.records = self.records[-self.window:]
        self.active_records = self.active_records[-self.window:]
        out = {"alloc/trust_records": float(len(self.records))}
        if len(self.records) >= self.min_records:
            d, se, r_act, r_uni = self.advantage()
            self.trust = float(0.5 * (1 + math.erf(d / (se * math.sqrt(2))))) if se > 0 else float(d > 0)
            out.update({"alloc/trust_active_ratio": r_act, "alloc/trust_uniform_ratio": r_uni})
        out["alloc/trust"] = self.trust
        return out

    def advantage(self) -> tuple[float, float, float, float]:
        """(difference, its standard error, active ratio, uniform ratio) from the records."""
        v = np.array([r[0] for r in self.records])
        k = np.array([r[1] for r in self.records])
        n = np.array([r[2] for r in self.records])
        whole = np.array([r[3] for r in self.records])
        budget, pool = self._shape
        cap = int(min(self.cap, n.min()))
        # Trace's selection rate (root budget per candidate prompt) applied to the recorded prompts.
        b = max(2, 2 * round(budget * len(v) / max(pool, 1) / 2))
        b = min(b, 2 * (len(v) * cap // 2))
        m = solve_roots(np.clip(v, 0.0, 1.0), b, cap)
        chosen = np.flatnonzero(m)
        draws = np.minimum(m[chosen] * (1 + self._multiplier), n[chosen])
        u_act = mixed_share(k[chosen], n[chosen], draws)
        if len(u_act) < 2:
            return 0.0, float("inf"), float("nan"), float(whole.mean())
        se = math.sqrt(np.var(u_act, ddof=1) / len(u_act) + np.var(whole, ddof=1) / len(whole))
        return float(u_act.mean() - whole.mean()), se, float(u_act.mean()), float(whole.mean())

    def state_dict(self) -> dict[str, Any]:
        return {"trust": self.trust, "records": [list(r) for r in self.records],
                "active_records": list(self.active_records)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.trust = float(state.get("trust", 0.0))
        self.records = [(float(v), int(k), int(n), float(w)) for v, k, n, w in state.get("records", [])]
        self.active_records = [float(x) for x in state.get("active_records", [])]


def expand_counts(allocator: Allocator, rewards: np.ndarray, values: np.ndarray, budget: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """(counts per open prefix, extra root rollouts): the root takes the budget when no prefix is open."""
    if len(rewards) == 0:
        return np.zeros(0, dtype=np.int64), budget
    return allocator.allocate_prefixes(rewards, values, budget, rng), 0


# name -> (roots, prefixes, oracle): the paper's method, its baselines and the ablations of its two stages
_MODES: dict[str, tuple[RootMode, PrefixMode, bool]] = {
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

# name -> the module whose ``make_variant(name, group_size, cap)`` builds it (imported when one is asked for):
# allocators not in the paper, registered here by name and kept in their own module.
VARIANTS: dict[str, str] = dict.fromkeys(("trace_root", "trace_refund", "trace_plus", "trace_root_uniform"),
                                         "trace_gym.training.variants")


def make_allocator(name: str, group_size: int = 8, cap: int = 16,
                   flip_scale_prior: float | None = None) -> StagedAllocator | AdaptiveAllocator:
    """A named allocator: one of ``ALLOCATORS`` (a fresh one: ``trace_adaptive`` keeps state across steps).
    ``flip_scale_prior`` gives a TRACE variant a flip scale (training/variants.py, `FlipScale`)."""
    if flip_scale_prior is not None and name not in VARIANTS:
        raise ConfigError(f"expected a TRACE variant in {tuple(VARIANTS)} for a flip scale, got {name!r}; fix: "
                          "drop alloc.flip_scale")
    if name == "trace_adaptive":
        return AdaptiveAllocator(name, group_size, cap)
    if name in VARIANTS:
        made: StagedAllocator = importlib.import_module(VARIANTS[name]).make_variant(name, group_size, cap,
                                                                                      flip_scale_prior)
        return made
    if name not in _MODES:
        raise ConfigError(f"expected an allocator in {ALLOCATORS}, got {name!r}")
    roots, prefixes, oracle = _MODES[name]
    return StagedAllocator(name, roots, prefixes, oracle, group_size, cap)
