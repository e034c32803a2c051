"""A synthetic multi-turn task with known success probabilities, and an LLM-free allocation loop.

Each task is a walk of at most ``horizon`` moves that succeeds once ``need`` moves were good. The scripted
policy makes a good move with the task's probability ``p_good``; the episode ends as soon as the outcome is
settled (``need`` good moves: reward 1; more than ``horizon - need`` bad moves: reward 0). So the success
probability of any prefix with t moves, g of them good, is exact:
    V(t, g) = P(Binomial(horizon - t, p_good) >= need - g).
The prompt names the goal and a terrain word that hints at ``p_good`` (right 70% of the time), so a text
predictor can learn difficulty beyond memorising task ids.

``simulate_step`` runs allocate -> bare rollouts -> predictor -> expand -> targets -> calibration -> fit ->
metrics on ``RolloutTree``s at thousands of trajectories per second; benchmarks reuse it.

Deviations and choices where the paper is silent:
1. The environment is synthetic: the policy is scripted and never learns, so the loop measures allocation
   quality (effective ratio, contrastive pairs, calibration) at a fixed policy, not learning speed.
2. The predictor is fit on each step's fresh trees after its calibration on them is recorded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trace_gym.env import TextEnv, Turn
from trace_gym.errors import ConfigError
from trace_gym.tasks import Task
from trace_gym.tree import RolloutTree

from .advantages import AdvantageMethod
from .allocators import Allocator, StepBudget, expand_counts
from .metrics import brier, calibration_metrics, tree_metrics
from .predictor import Predictor, Prefix, training_examples

TERRAIN = ("treacherous", "rocky", "hilly", "gentle", "flat")  # low to high p_good
GOOD_ACTION = "move {t}: take the safe path"
BAD_ACTION = "move {t}: take the shortcut"


def make_tasks(n: int, horizon: int = 4, seed: int = 0, hint_accuracy: float = 0.7) -> list[Task]:
    """``n`` tasks with p_good ~ Beta(0.7, 0.7) and need ~ U{1..horizon}: many near-certain outcomes."""
    if horizon < 1:
        raise ConfigError(f"expected horizon >= 1, got {horizon}")
    rng = np.random.default_rng(seed)
    tasks = []
    for i in range(n):
        p = float(rng.beta(0.7, 0.7))
        need = int(rng.integers(1, horizon + 1))
        tier = min(int(p * len(TERRAIN)), len(TERRAIN) - 1)
        if rng.random() > hint_accuracy:
            tier = int(rng.integers(len(TERRAIN)))
        prompt = f"Reach {need} checkpoints in at most {horizon} moves across {TERRAIN[tier]} terrain."
        tasks.append(Task(f"sim-{i}", prompt, answer=None, meta={"p_good": p, "need": need, "horizon": horizon}))
    return tasks


def _params(task: Task) -> tuple[float, int, int]:
    return float(task.meta["p_good"]), int(task.meta["need"]), int(task.meta["horizon"])


def value_at(task: Task, moves: int, good: int) -> float:
    """Exact success probability after ``moves`` moves of which ``good`` were good."""
    p, need, horizon = _params(task)
    left, still = horizon - moves, need - good
    if still <= 0:
        return 1.0
    if still > left:
        return 0.0
    return float(sum(math.comb(left, j) * p**j * (1 - p) ** (left - j) for j in range(still, left + 1)))


def true_value(task: Task, prefix_actions: Sequence[str]) -> float:
    """Exact success probability of the scripted policy after ``prefix_actions`` (the oracle's input)."""
    good = sum(_is_good(a) for a in prefix_actions)
    return value_at(task, len(prefix_actions), good)


def _is_good(action: str) -> bool:
    return "safe path" in action


def move(task: Task, moves: int, good: int, is_good: bool) -> tuple[str, float, bool, int, int]:
    """One move from state (moves, good): (observation, reward, terminated, moves', good')."""
    _, need, horizon = _params(task)
    moves, good = moves + 1, good + int(is_good)
    if good >= need:
        return "checkpoint reached; goal complete", 1.0, True, moves, good
    if moves - good > horizon - need:
        return "error: dead end; goal failed", 0.0, True, moves, good
    obs = f"checkpoint reached ({good}/{need})" if is_good else f"error: dead end ({good}/{need})"
    return obs, 0.0, False, moves, good


def scripted_action(task: Task, moves: int, rng: np.random.Generator) -> str:
    """The scripted policy: a good move with probability p_good."""
    good = rng.random() < _params(task)[0]
    return (GOOD_ACTION if good else BAD_ACTION).format(t=moves + 1)


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


# ----------------------------------------------------------------- the LLM-free allocation loop
def _rollout(tree: RolloutTree, task: Task, node_id: int, state: dict[int, tuple[int, int]],
             rng: np.random.Generator) -> int:
    """Play the scripted policy from ``node_id`` to the end; returns the leaf id."""
    moves, good = state[node_id]
    while True:
        action = scripted_action(task, moves, rng)
        is_good = _is_good(action)
        obs, reward, terminated, moves, good = move(task, moves, good, is_good)
        info = {"tokens": len(action.split())} if is_good else {"tokens": len(action.split()), "error": "dead end"}
        node = tree.add(node_id, action, obs, reward, terminated, False, info)
        state[node.id] = (moves, good)
        node_id = node.id
        if terminated:
            return node_id


def _values(allocator: Allocator, predictor: Predictor, tasks: Sequence[Task], prefixes: Sequence[Prefix],
            states: Sequence[tuple[int, int]]) -> np.ndarray:
    if allocator.oracle:
        return np.array([value_at(t, m, g) for t, (m, g) in zip(tasks, states)])
    return predictor.predict(prefixes)


@dataclass
class SimStep:
    """One simulated step: the trees, the metrics, and the pool indices with their root counts."""

    trees: list[RolloutTree]
    metrics: dict[str, Any]
    roots: dict[int, int]


def simulate_step(allocator: Allocator, predictor: Predictor, pool: Sequence[Task], budget: StepBudget,
                  rng: np.random.Generator, advantage: AdvantageMethod = "tree_grpo") -> SimStep:
    """allocate -> bare rollouts -> predictor -> expand -> targets -> calibration -> fit, on the sim task."""
    root_states = [(0, 0)] * len(pool)
    root_prefixes = [Prefix(t.id, t.prompt) for t in pool]
    values = (_values(allocator, predictor, pool, root_prefixes, root_states) if allocator.needs_root_values
              else np.full(len(pool), 0.5))
    roots = allocator.allocate_roots(values, allocator.root_budget(budget), rng)

    trees: list[RolloutTree] = []
    sim_states: list[dict[int, tuple[int, int]]] = []  # per tree: node id -> (moves, good)
    for index, m in roots.items():
        task = pool[index]
        tree = RolloutTree(task.id, task.prompt)
        state = {0: (0, 0)}
        leaves = [_rollout(tree, task, 0, state, rng) for _ in range(m)]
        # Open prefixes: non-terminal nodes of depth >= 1 on the bare rollouts, with their rollout's reward.
        open_ids, rewards = [], []
        for leaf in leaves:
            for node in tree.path(leaf)[1:-1]:
                open_ids.append(node.id)
                rewards.append(tree.nodes[leaf].reward)
        prefix_budget = allocator.prefix_budget(m, budget)
        if allocator.needs_prefix_values and open_ids:
            pv = _values(allocator, predictor, [task] * len(open_ids),
                         [Prefix.from_tree(tree, i) for i in open_ids], [state[i] for i in open_ids])
        else:
            pv = np.full(len(open_ids), 0.5)
        counts, root_extra = expand_counts(allocator, np.array(rewards, dtype=np.float64), pv, prefix_budget, rng)
        for node_id, k in zip(open_ids, counts):
            tree.nodes[node_id].meta["continuations"] = int(k)
            for _ in range(k):
                _rollout(tree, task, node_id, state, rng)
        for _ in range(root_extra):
            _rollout(tree, task, 0, state, rng)
        tree.root.meta.update({"roots": m, "root_value": float(values[index]), "root_extra": root_extra})
        trees.append(tree)
        sim_states.append(state)

    metrics: dict[str, Any] = dict(tree_metrics(trees, advantage))
    metrics.update(allocator.observe(dict(zip(roots, trees))))  # before the fit, as in the trainer
    metrics["alloc/budget"] = float(budget.total)
    metrics["alloc/budget_used"] = metrics["rollout/trajectories"]
    metrics["alloc/pool_true_mixed"] = _pool_mixed_mass(pool)
    prefixes, targets, weights = training_examples(trees)
    if prefixes:
        # training_examples lists the non-terminal nodes tree by tree in id order; here all have leaves.
        truth = np.array([value_at(pool[index], *state[node.id])
                          for tree, state, index in zip(trees, sim_states, roots)
                          for node in tree.nodes if not node.is_terminal])
        pred = predictor.predict(prefixes)
        metrics.update(calibration_metrics(pred, targets, weights))
        metrics["predictor/brier_true"] = brier(pred, truth, weights)
        metrics.update(predictor.fit(prefixes, targets, weights))
    return SimStep(trees, metrics, roots)


def _pool_mixed_mass(pool: Sequence[Task]) -> float:
    """Mean over the pool of 2·v(1-v), the chance that a pair of rollouts is mixed (how much signal exists)."""
    v = np.array([value_at(t, 0, 0) for t in pool])
    return float(np.mean(2 * v * (1 - v)))


def run_simulation(allocator: Allocator, predictor: Predictor, tasks: Sequence[Task], budget: StepBudget,
                   steps: int, pool_size: int, seed: int = 0,
                   advantage: AdvantageMethod = "tree_grpo") -> list[dict[str, Any]]:
    """``steps`` simulated steps, each on a fresh candidate pool drawn from ``tasks``; one metrics dict each."""
    if pool_size > len(tasks):
        raise ConfigError(f"expected pool_size <= {len(tasks)} tasks, got {pool_size}")
    rng = np.random.default_rng(seed)
    history = []
    for _ in range(steps):
        pool = [tasks[i] for i in rng.choice(len(tasks), size=pool_size, replace=False)]
        history.append(simulate_step(allocator, predictor, pool, budget, rng, advantage).metrics)
    return history
