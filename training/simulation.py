"""A synthetic multi-turn task with known success probabilities, and an LLM-free allocation loop.

Each task is a walk of at most ``horizon`` moves that succeeds once ``need`` moves were good. The scripted
policy makes a good move with the task's probability ``p_good``; the episode ends as soon as the outcome is
settled (``need`` good moves: reward 1; more than ``horizon - need`` bad moves: reward 0). So the success
probability of any prefix with t moves, g of them good, is exact:
    V(t, g) = P(Binomial(horizon - t, p_good) >= need - g).
The prompt names the goal and a terrain word that hints at ``p_good`` (right 70% of the time), so a text
predictor can learn difficulty beyond memorising task ids.

``SimCollector`` is a `Collector` that plays the scripted policy on ``RolloutTree``s directly, at thousands of
trajectories per second, and knows every prefix's exact value (the oracle allocator's input); the step
itself is the trainer's (`step.take_step`), and ``run_simulation`` loops it over fresh candidate pools.

Deviations and choices where the paper is silent:
1. The environment is synthetic: the policy is scripted and never learns, so the loop measures allocation
   quality (effective ratio, contrastive pairs, calibration) at a fixed policy, not learning speed.
2. The predictor is fit on each step's fresh trees after its calibration on them is recorded.
3. The collector plays each started rollout to its end before the next (there is no batched generation to
   keep in lockstep); rollout i of a stage call draws its moves from ``generator(seed, i)``.
4. Opt-in (``logprobs=True``), each move's node records the scripted policy's log-probability of that move
   (one value: log p_good or log(1 - p_good)) as `Node.logprobs`, where a tokenizer-backed collector records
   its sampled tokens'. It carries the task's p_good exactly, which a real policy's log-probs only hint at.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.seeds import generator
from trace_gym.tasks import Task
from trace_gym.training.allocation.allocators import Allocator
from trace_gym.training.allocation.predictor import Predictor, Prefix
from trace_gym.training.config import AdvantageMethod, StepBudget
from trace_gym.training.rollout.collector import CollectStats, bare_starts, continuation_starts
from trace_gym.training.step import take_step
from trace_gym.tree import RolloutTree

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


# ----------------------------------------------------------------- the LLM-free collector and loop
class SimCollector:
    """A `Collector` (collector.py) of the synthetic task with exact values (`true_values`); see choice 3."""

    def __init__(self, tasks: Sequence[Task], logprobs: bool = False):
        self.tasks = {t.id: t for t in tasks}
        self.logprobs = logprobs
        """Record each move's log-probability on its node (choice 4; off: nodes carry none)."""
        self._trees: dict[str, RolloutTree] = {}
        self._states: dict[str, dict[int, tuple[int, int]]] = {}  # per tree: node id -> (moves, good)

    @property
    def trees(self) -> dict[str, RolloutTree]:
        return dict(self._trees)

    def begin_step(self) -> None:
        self._trees.clear()
        self._states.clear()

    def bare_rollouts(self, counts: Mapping[str, int], seed: int) -> CollectStats:
        starts = bare_starts(counts, self._trees, self.tasks)
        for tid in dict.fromkeys(tid for tid, _ in starts):
            self._trees[tid] = RolloutTree(tid, self.tasks[tid].prompt)
            self._states[tid] = {0: (0, 0)}
        return self._run(starts, seed)

    def continuations(self, counts: Mapping[tuple[str, int], int], seed: int) -> CollectStats:
        return self._run(continuation_starts(counts, self._trees), seed)

    def true_values(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        """Exact success probability of the scripted policy after each prefix."""
        return np.array([true_value(self.tasks[p.task_id], [a for a, _ in p.turns]) for p in prefixes])

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        raise ConfigError("expected a collector whose policy has weights, got the simulation's scripted policy; "
                          "fix: train on a real env (the simulation measures allocation at a fixed policy)")

    def close(self) -> None:
        self.begin_step()

    def _run(self, starts: Sequence[tuple[str, int]], seed: int) -> CollectStats:
        stats = CollectStats(trajectories=len(starts))
        for i, (tid, node_id) in enumerate(starts):
            self._play(tid, node_id, generator(seed, i), stats)
        return stats

    def _play(self, tid: str, node_id: int, rng: np.random.Generator, stats: CollectStats) -> None:
        """The scripted policy from ``node_id`` to the end of the episode."""
        tree, state, task = self._trees[tid], self._states[tid], self.tasks[tid]
        moves, good = state[node_id]
        terminated = False
        while not terminated:
            action = scripted_action(task, moves, rng)
            is_good = _is_good(action)
            obs, reward, terminated, moves, good = move(task, moves, good, is_good)
            info: dict[str, Any] = {"tokens": len(action.split())}
            if not is_good:
                info["error"] = "dead end"
            node = tree.add(node_id, action, obs, reward, terminated, False, info)
            if self.logprobs:
                p = _params(task)[0]
                node.logprobs = [math.log(max(p if is_good else 1.0 - p, 1e-300))]
            state[node.id] = (moves, good)
            node_id = node.id
            stats.env_steps += 1
            stats.generated_tokens += info["tokens"]


def pool_mixed_mass(pool: Sequence[Task]) -> float:
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
    collector = SimCollector(tasks)
    history = []
    for step in range(1, steps + 1):
        pool = [tasks[i] for i in rng.choice(len(tasks), size=pool_size, replace=False)]
        metrics = take_step(collector, allocator, predictor, pool, budget, seed=seed, step=step,
                            advantage=advantage).metrics
        metrics["alloc/pool_true_mixed"] = pool_mixed_mass(pool)
        history.append(metrics)
    return history
