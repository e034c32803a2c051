"""Does one policy update carry signal? The shuffled-advantage check.

One training step's rollouts are collected at the current policy; the update is applied twice from the same
weights and optimiser state: once with the true advantages and once with the same advantage values randomly
permuted over the trained nodes (same magnitudes, no relation to outcomes: pure noise of the same size).
Both updated policies and the starting one are evaluated on the same held-out prompts, and the per-prompt
differences give paired intervals. A setting carries signal when `true - shuffled` is clearly positive; it
learns when `true - before` is, and the shuffled arm shows how much a step of that size costs by noise alone.

Choices:
1. The rollouts are the trainer's own step (`step.take_step` with its collector, allocator and predictor)
   and the update is the trainer's own (`Learner.update` on `step.build_samples` of the step's trees,
   packed or rows as ``optim.update`` says), so every optimiser setting (lr, optimiser, betas/eps,
   mini-batch, epochs) is checked as training would run it.
2. Weights, optimiser state, the predictor's and the allocator's state (the step fits and informs them) and
   the data position are restored, so the check leaves the trainer as it found it.
3. ``repeats`` independent rollout batches (seeds (seed, 1, r)) average out the batch's own noise; the
   per-prompt differences are averaged over repeats before the interval is taken (prompts are the unit).
4. Two held-out measures: ``sampled`` (k episodes per prompt at T = 1 through `evaluate.evaluate`, a fresh
   seed per arm and repeat) and ``expert`` (teacher-forced P(the env's scripted expert trajectory), no
   sampling noise; only for envs whose expert plays one canonical solution, such as Arithmetic). Intervals
   are `evaluate.PairedDifference`'s: 95% Student-t over prompts.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.training.rollout.evaluate import expert_logprob, expert_sequences
from trace_gym.training.stats import PairedDifference

Measure = Literal["sampled", "expert"]


def _seed(*parts: int) -> int:
    return int(np.random.default_rng(list(parts)).integers(2**31))


def collect_samples(trainer: Any, seed: int) -> tuple[list[Any], dict[str, float]]:
    """One step's trained samples at the current policy and the step's metrics: the trainer's own step
    (`take_step`) without the policy update. It fits the trainer's predictor and informs its allocator;
    `collect_batches` restores both."""
    from trace_gym.training.step import build_samples, take_step

    cfg = trainer.cfg
    pool = trainer.stream.take(cfg.alloc.pool_size)
    result = take_step(trainer.collector, trainer.allocator, trainer.predictor, pool, trainer.budget, seed=seed,
                       step=0, advantage=cfg.optim.advantage)
    samples = build_samples(result.trees, cfg.optim.advantage, cfg.optim.skip_zero_advantage).samples
    return samples, result.metrics


def shuffled(samples: Sequence[Any], rng: np.random.Generator) -> list[Any]:
    """The same samples with their advantage values permuted at random."""
    adv = np.array([s.advantage for s in samples])[rng.permutation(len(samples))]
    return [dataclasses.replace(s, advantage=float(a)) for s, a in zip(samples, adv)]


class HeldOut:
    """Per-prompt held-out measure of the trainer's policy on the first ``tasks`` eval prompts; `close` it
    (it holds an evaluation collector for the sampled measure)."""

    def __init__(self, trainer: Any, tasks: int, samples: int, measure: Measure):
        from trace_gym.agents.policy import SamplingParams
        from trace_gym.env_specs import env_tasks
        from trace_gym.training.rollout.collector import TreeCollector

        if measure not in ("sampled", "expert"):
            raise ConfigError(f"expected measure 'sampled' or 'expert', got {measure!r}; fix: measure='sampled'")
        if samples < 1:
            raise ConfigError(f"expected samples >= 1, got {samples}")
        self.trainer, self.samples, self.measure = trainer, samples, measure
        self.tasks = env_tasks(trainer.make_eval_env)[:tasks]
        if not self.tasks:
            raise ConfigError("expected held-out prompts, got none; fix: check env.eval_kwargs")
        self._expert: list[tuple[list[int], list[bool]]] | None = None
        self._collector: TreeCollector | None = None
        if measure == "sampled":
            cfg = trainer.cfg
            sampling = SamplingParams(temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens)
            self._collector = TreeCollector(trainer.policy, trainer.make_eval_env, self.tasks, sampling,
                                            trainer.tokenizer, "replay", cfg.env.workers, cfg.rollout.max_context)

    def __call__(self, seed: int) -> np.ndarray:
        """(tasks,) success share (sampled) or P(expert trajectory) (expert) per prompt."""
        from trace_gym.training.rollout.evaluate import evaluate

        t = self.trainer
        if self._collector is not None:
            result = evaluate(self._collector, self.tasks, self.samples, seed)
            by_id = {o.task_id: o.success for o in result.tasks}
            return np.array([by_id[task.id] for task in self.tasks], dtype=np.float64)
        if self._expert is None:
            self._expert = expert_sequences(t.make_eval_env, self.tasks, t.tokenizer)
        return np.exp(expert_logprob(t.learner.model, self._expert, t.tokenizer.pad_token_id))

    def close(self) -> None:
        if self._collector is not None:
            self._collector.close()
            self._collector = None


def collect_batches(trainer: Any, repeats: int, seed: int) -> list[tuple[list[Any], dict[str, float]]]:
    """``repeats`` independent step batches (trained samples, step metrics) at the trainer's current policy;
    the data position, the predictor and the allocator are restored afterwards (choice 2)."""
    position = trainer.stream.position
    predictor = copy.deepcopy(trainer.predictor.state_dict())
    allocator = copy.deepcopy(trainer.allocator.state_dict())
    try:
        return [collect_samples(trainer, _seed(seed, 1, r)) for r in range(repeats)]
    finally:
        trainer.stream.position = position
        trainer.predictor.load_state_dict(predictor)
        trainer.allocator.load_state_dict(allocator)


def signal_check(trainer: Any, repeats: int = 1, tasks: int = 200, samples: int = 4,
                 measure: Measure = "sampled", seed: int | None = None,
                 batches: Sequence[tuple[list[Any], dict[str, float]]] | None = None,
                 held: HeldOut | None = None, base: np.ndarray | None = None) -> dict[str, Any]:
    """The shuffled-advantage check on ``trainer`` (see the module docstring); returns paired differences
    (`evaluate.PairedDifference`) ``true_vs_before``, ``shuffled_vs_before``, ``true_vs_shuffled`` and the
    base level. ``batches`` (`collect_batches`), ``held`` and its ``base`` values may be passed to compare
    optimiser settings on the same rollouts and prompts."""
    if repeats < 1:
        raise ConfigError(f"expected repeats >= 1, got {repeats}")
    seed = trainer.cfg.seed if seed is None else seed
    learner = trainer.learner
    weights = copy.deepcopy(learner.model.state_dict())
    opt_state = copy.deepcopy(learner.optimizer.state_dict())
    own = held is None
    held = held or HeldOut(trainer, tasks, samples, measure)
    true_d, shuf_d, nodes, ratios = [], [], [], []
    try:
        base = held(_seed(seed, 0)) if base is None else base
        batches = list(batches) if batches is not None else collect_batches(trainer, repeats, seed)
        for r, (samples_r, m) in enumerate(batches):
            nodes.append(len(samples_r))
            ratios.append(m["alloc/effective_ratio"])
            arms = {"true": samples_r, "shuffled": shuffled(samples_r, np.random.default_rng(_seed(seed, 2, r)))}
            for k, (name, arm) in enumerate(arms.items()):
                if arm:
                    learner.update(arm, _seed(seed, 3, r), trainer.tokenizer.pad_token_id)
                    trainer.sync_weights()  # a backend with its own copy of the weights samples the updated ones
                after = held(_seed(seed, 4, r, k))
                (true_d if name == "true" else shuf_d).append(after)
                learner.model.load_state_dict(weights)
                learner.optimizer.load_state_dict(copy.deepcopy(opt_state))
                trainer.sync_weights()
    finally:
        learner.model.load_state_dict(weights)
        learner.optimizer.load_state_dict(opt_state)
        trainer.sync_weights()
        if own:
            held.close()
    t_mean, s_mean = np.mean(true_d, axis=0), np.mean(shuf_d, axis=0)
    return {"measure": held.measure, "tasks": len(base), "samples": held.samples if held.measure == "sampled" else 0,
            "repeats": len(batches), "before": float(base.mean()), "true": float(t_mean.mean()),
            "shuffled": float(s_mean.mean()), "true_vs_before": PairedDifference.of(t_mean - base),
            "shuffled_vs_before": PairedDifference.of(s_mean - base),
            "true_vs_shuffled": PairedDifference.of(t_mean - s_mean),
            "nodes": float(np.mean(nodes)), "effective_ratio": float(np.mean(ratios))}
