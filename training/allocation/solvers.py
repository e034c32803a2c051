"""Allocation utilities and their exact solvers (TRACE, arXiv 2606.11119, Eqs. 12-14 as reported).

Stage 1 gives prompt i with predicted success v_i a number of root rollouts m_i maximising
Σ_i U_root(v_i, m_i), U_root(v, m) = 1 - v^m - (1-v)^m (the chance that the group holds both a success and
a failure), subject to Σ m_i = M and m_i ∈ {0} ∪ {2..cap}. Stage 2 gives the non-terminal prefixes of a
prompt's bare rollouts K continuations each, maximising Σ (1 - q^K) with q = r·v + (1-r)(1-v) (the chance
that a continuation repeats the rollout's outcome r), subject to Σ K = budget.

Deviations and choices where the paper is silent:
1. U_root(v, 0) is defined as 0 (the formula gives -1 at m = 0; no rollouts means no mixed group).
2. The root problem is solved exactly by dynamic programming over prompts × budget (O(n·M·cap)). A greedy
   that treats the first two rollouts as one block is not exact: the {0} ∪ {2..cap} constraint makes the
   problem a knapsack with parity effects (e.g. M odd).
3. The budget is spent exactly. When no allocation spends exactly M (M = 1, M > n·cap, odd M with cap = 2)
   the solver raises ``ConfigError`` saying how to fix the sizes, rather than silently spending less.
4. Ties are broken towards earlier prompts (root DP) and earlier prefixes (prefix greedy), so the solvers
   are deterministic.
5. The prefix solver spends its whole budget even when every marginal gain is 0 (q = 1): budget
   conservation across allocators matters more than the wasted continuations, which still train. The
   refund variants (training/variants.py) hand such continuations back to the root stage instead,
   reading the root stage's optimum at every budget (`root_values_by_budget`).
"""

from __future__ import annotations

import heapq

import numpy as np

from trace_gym.errors import ConfigError


def root_utility(v: np.ndarray | float, m: np.ndarray | int) -> np.ndarray:
    """P(a group of m rollouts with success probability v holds both outcomes); 0 at m = 0."""
    v = np.asarray(v, dtype=np.float64)
    m = np.asarray(m)
    u = 1.0 - v**m - (1.0 - v) ** m
    return np.where(m == 0, 0.0, u)


def prefix_same_outcome(r: np.ndarray | float, v: np.ndarray | float) -> np.ndarray:
    """q = r·v + (1-r)(1-v): the chance that one continuation repeats the rollout's reward r."""
    r = np.asarray(r, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    return r * v + (1.0 - r) * (1.0 - v)


def prefix_utility(r: np.ndarray | float, v: np.ndarray | float, k: np.ndarray | int) -> np.ndarray:
    """U_pref = 1 - q^k: the chance that at least one of k continuations contradicts the rollout."""
    return 1.0 - prefix_same_outcome(r, v) ** np.asarray(k)


def _check_probabilities(name: str, x: np.ndarray) -> None:
    if x.ndim != 1 or not np.all(np.isfinite(x)) or np.any(x < 0) or np.any(x > 1):
        # A predictor that breaks its contract is a bug, not a setting: a plain error with its traceback.
        raise ValueError(f"expected {name} as a 1-D array of probabilities in [0, 1], got {x!r} (a predictor "
                         "must return finite values in [0, 1])")


def _root_dp(values: np.ndarray, budget: int, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """(best, choice): best[b], the largest Σ U_root spending exactly b (-inf where no allocation does), and
    choice[i, b], m_i at that optimum over the first i + 1 prompts."""
    v = np.asarray(values, dtype=np.float64)
    _check_probabilities("values", v)
    n = len(v)
    if cap < 2:
        raise ConfigError(f"expected cap >= 2 (a chosen prompt needs 2 rollouts), got {cap}; fix: raise cap")
    if budget < 0:
        raise ConfigError(f"expected a budget >= 0, got {budget}")
    options = np.arange(2, cap + 1)
    neg = -np.inf
    # best[b]: best utility of the prompts seen so far spending exactly b; choice[i, b]: m_i at that optimum.
    best = np.full(budget + 1, neg)
    best[0] = 0.0
    choice = np.zeros((n, budget + 1), dtype=np.int32)
    for i in range(n):
        gains = root_utility(v[i], options)
        new = best.copy()  # m_i = 0
        for m, g in zip(options, gains):
            if m > budget:
                break
            cand = np.full(budget + 1, neg)
            cand[m:] = best[:-m] + g
            better = cand > new + 1e-12  # strict: ties keep the smaller m (towards earlier prompts' rollouts)
            new = np.where(better, cand, new)
            choice[i] = np.where(better, m, choice[i])
        best = new
    return best, choice


def solve_roots(values: np.ndarray, budget: int, cap: int) -> np.ndarray:
    """Exact m maximising Σ U_root(v_i, m_i) with Σ m = budget, m_i ∈ {0} ∪ {2..cap}.

    values: (n,) success probabilities. Returns (n,) int64 counts. Raises ConfigError when infeasible.
    """
    best, choice = _root_dp(values, budget, cap)
    n = len(choice)
    if not np.isfinite(best[budget]):
        raise ConfigError(
            f"expected a root budget that {n} prompts with 0 or 2..{cap} rollouts each can spend exactly, "
            f"got {budget}; fix: use an even budget >= 2, at most pool_size·cap = {n * cap} (and cap >= 3 "
            "for odd budgets), or enlarge the candidate pool")
    m = np.zeros(n, dtype=np.int64)
    b = budget
    for i in range(n - 1, -1, -1):
        m[i] = choice[i, b]
        b -= m[i]
    return m


def root_values_by_budget(values: np.ndarray, budget: int, cap: int) -> np.ndarray:
    """(budget + 1,): the optimum of the root problem over ``values`` at every budget 0..budget (-inf where
    no allocation spends it exactly): what b more root rollouts on these prompts would add."""
    return _root_dp(values, budget, cap)[0]


def solve_prefixes(rewards: np.ndarray, values: np.ndarray, budget: int,
                   scale: np.ndarray | None = None) -> np.ndarray:
    """K maximising Σ s_j (1 - q_j^K_j) with Σ K = budget (greedy by marginal gain s·q^K(1-q); exact: concave).

    rewards: (P,) the reward of the bare rollout each prefix lies on; values: (P,) predicted success of the
    prefix; scale: (P,) s_j >= 0, what a predicted flip of prefix j is worth (None: 1 each, the paper's).
    Returns (P,) int64 continuation counts.
    """
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    _check_probabilities("rewards", r)
    _check_probabilities("values", v)
    if r.shape != v.shape:
        raise ValueError(f"expected rewards and values of one shape, got {r.shape} and {v.shape}")
    if budget < 0:
        raise ConfigError(f"expected a budget >= 0, got {budget}")
    k = np.zeros(len(r), dtype=np.int64)
    if budget == 0:
        return k
    if len(r) == 0:
        raise ConfigError(f"expected at least one prefix to spend a budget of {budget}, got none; fix: send "
                          "the budget to the root (extra bare rollouts) when a prompt has no open prefix")
    s = np.ones(len(r)) if scale is None else np.asarray(scale, dtype=np.float64)
    if s.shape != r.shape or not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError(f"expected a scale of shape {r.shape} with finite values >= 0, got {s!r}")
    q = prefix_same_outcome(r, v)
    # Max-heap on gain, ties to the lower index; the gain of the next continuation is s·q^K (1 - q).
    heap = [(-s[j] * (1.0 - qj), j) for j, qj in enumerate(q)]
    heapq.heapify(heap)
    for _ in range(budget):
        _, j = heapq.heappop(heap)
        k[j] += 1
        heapq.heappush(heap, (-s[j] * (q[j] ** k[j]) * (1.0 - q[j]), j))
    return k
