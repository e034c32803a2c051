"""Does one policy update carry signal? The shuffled-advantage check.

One training step's rollouts are collected at the current policy; the update is applied twice from the same
weights and optimiser state: once with the true advantages and once with the same advantage values randomly
permuted over the trained nodes (same magnitudes, no relation to outcomes: pure noise of the same size).
Both updated policies and the starting one are evaluated on the same held-out prompts, and the per-prompt
differences give paired intervals. A setting carries signal when `true - shuffled` is clearly positive; it
learns when `true - before` is, and the shuffled arm shows how much a step of that size costs by noise alone.

Choices:
1. The update is the trainer's own (`Learner.update` on `build_samples` of the step's trees), so every
   optimiser setting (lr, optimiser, betas/eps, mini-batch, epochs) is checked as training would run it.
2. Weights and optimiser state are restored after each arm, so the check leaves the trainer as it found it.
3. ``repeats`` independent rollout batches (seeds (seed, "signal", r)) average out the batch's own noise; the
   per-prompt differences are averaged over repeats before the interval is taken (prompts are the unit).
4. Two held-out measures: ``sampled`` (k episodes per prompt at T = 1, a fresh seed per arm and repeat) and
   ``expert`` (teacher-forced P(the env's scripted expert trajectory), no sampling noise; only for envs whose
   expert plays one canonical solution, such as Arithmetic). Intervals are 95% normal over prompts.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from trace_gym.errors import ConfigError

Measure = Literal["sampled", "expert"]


@dataclass
class PairedDiff:
    """Mean of per-prompt differences and its 95% interval half-width."""

    mean: float
    ci95: float
    n: int

    @classmethod
    def of(cls, diffs: np.ndarray) -> PairedDiff:
        d = np.asarray(diffs, dtype=np.float64)
        half = 1.96 * d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
        return cls(float(d.mean()), float(half), len(d))

    def __str__(self) -> str:
        return f"{self.mean:+.4f} ± {self.ci95:.4f}"


def _seed(*parts: int) -> int:
    return int(np.random.default_rng(list(parts)).integers(2**31))


def collect_samples(trainer: Any, seed: int) -> tuple[list[Any], dict[str, float]]:
    """One step's trained samples at the current policy (the trainer's stages, without fit or update)."""
    from trace_gym.agents.policy import sample_seed

    from .collector import CollectStats
    from .metrics import tree_metrics
    from .trainer import allocate_roots, build_samples, plan_continuations, root_values

    cfg = trainer.cfg
    rng = np.random.default_rng(seed)
    pool = trainer.stream.take(cfg.alloc.pool_size)
    values = root_values(trainer.allocator, trainer.predictor, pool)
    roots, _ = allocate_roots(trainer.allocator, trainer.predictor, pool, trainer.budget, rng, values)
    trainer.collector.begin_step()
    stats = CollectStats()
    stats += trainer.collector.bare_rollouts(roots, seed=sample_seed(seed, 0, 0))
    plan, _ = plan_continuations(trainer.allocator, trainer.predictor, trainer.collector.trees, roots,
                                 trainer.budget, rng)
    stats += trainer.collector.continuations(plan, seed=sample_seed(seed, 0, 1))
    trees = list(trainer.collector.trees.values())
    samples = build_samples(trees, cfg.optim.advantage, cfg.optim.skip_zero_advantage)
    return samples, tree_metrics(trees, cfg.optim.advantage)  # type: ignore[arg-type]


def shuffled(samples: Sequence[Any], rng: np.random.Generator) -> list[Any]:
    """The same samples with their advantage values permuted at random."""
    adv = np.array([s.advantage for s in samples])[rng.permutation(len(samples))]
    return [dataclasses.replace(s, advantage=float(a)) for s, a in zip(samples, adv)]


class HeldOut:
    """Per-prompt held-out measure of the trainer's policy on the first ``tasks`` eval prompts."""

    def __init__(self, trainer: Any, tasks: int, samples: int, measure: Measure):
        from .trainer import dataset_of

        if measure not in ("sampled", "expert"):
            raise ConfigError(f"expected measure 'sampled' or 'expert', got {measure!r}")
        self.trainer, self.samples, self.measure = trainer, samples, measure
        self.tasks = dataset_of(trainer.make_eval_env)[:tasks]
        if not self.tasks:
            raise ConfigError("expected held-out prompts, got none; fix: check env.eval_kwargs")
        self._expert: list[tuple[list[int], list[bool]]] | None = None

    def __call__(self, seed: int) -> np.ndarray:
        """(tasks,) success share (sampled) or P(expert trajectory) (expert) per prompt."""
        t = self.trainer
        if self.measure == "sampled":
            from trace_gym.agents.policy import SamplingParams
            from trace_gym.agents.rollout import play_episodes

            resets = [{"options": {"task": task}} for task in self.tasks for _ in range(self.samples)]
            sampling = SamplingParams(temperature=1.0, max_new_tokens=t.cfg.rollout.max_new_tokens, seed=seed)
            eps = play_episodes(t.policy, t.make_eval_env, resets, sampling, tokenizer=t.tokenizer,
                                max_context=t.cfg.rollout.max_context, parallel=64)
            return np.array([e.reward > 0 for e in eps], dtype=np.float64).reshape(len(self.tasks), -1).mean(1)
        if self._expert is None:
            self._expert = expert_sequences(t.make_eval_env, self.tasks, t.tokenizer)
        return np.exp(expert_logprob(t.learner.model, self._expert, t.tokenizer.pad_token_id))


def expert_sequences(make_env: Any, tasks: Sequence[Any], tokenizer: Any) -> list[tuple[list[int], list[bool]]]:
    """(ids, action mask) of the env's scripted expert playing each task, tokenised as SFT sees it."""
    from trace_gym.agents.chat import tokenize_episode
    from trace_gym.agents.policy import SamplingParams
    from trace_gym.agents.rollout import play_episodes
    from trace_gym.agents.scripted import ExpertPolicy

    probe = make_env()
    try:
        expert = probe.unwrapped.expert(noise=0.0, seed=0)
    finally:
        probe.close()
    eps = play_episodes(ExpertPolicy(expert), make_env, [{"options": {"task": t}} for t in tasks],
                        SamplingParams())
    out = []
    for e in eps:
        conv = tokenize_episode(tokenizer, e.messages)
        out.append((conv.ids, conv.action_mask()))
    return out


@torch.no_grad()
def expert_logprob(model: torch.nn.Module, seqs: Sequence[tuple[list[int], list[bool]]], pad_id: int,
                   batch: int = 64) -> np.ndarray:
    """(n,) log-probability at T = 1 of each sequence's action tokens (masked) under ``model``."""
    from trace_gym.agents.hf import sequence_logprobs

    was = model.training
    model.eval()
    out = []
    for s in range(0, len(seqs), batch):
        part = seqs[s:s + batch]
        width = max(len(i) for i, _ in part)
        ids = torch.full((len(part), width), pad_id, dtype=torch.long)
        att = torch.zeros((len(part), width), dtype=torch.long)
        mask = torch.zeros((len(part), width))
        for r, (i, m) in enumerate(part):
            ids[r, :len(i)] = torch.tensor(i)
            att[r, :len(i)] = 1
            mask[r, :len(m)] = torch.tensor(m, dtype=torch.float32)
        device = next(model.parameters()).device
        lp = sequence_logprobs(model, ids.to(device), att.to(device)).cpu()
        out.append((lp * mask[:, 1:]).sum(-1).double().numpy())
    model.train(was)
    return np.concatenate(out) if out else np.zeros(0)


def collect_batches(trainer: Any, repeats: int, seed: int) -> list[tuple[list[Any], dict[str, float]]]:
    """``repeats`` independent step batches (trained samples, tree metrics) at the trainer's current policy;
    the data position is restored afterwards."""
    position = trainer.stream.position
    try:
        return [collect_samples(trainer, _seed(seed, 1, r)) for r in range(repeats)]
    finally:
        trainer.stream.position = position


def signal_check(trainer: Any, repeats: int = 1, tasks: int = 200, samples: int = 4,
                 measure: Measure = "sampled", seed: int | None = None,
                 batches: Sequence[tuple[list[Any], dict[str, float]]] | None = None,
                 held: HeldOut | None = None, base: np.ndarray | None = None) -> dict[str, Any]:
    """The shuffled-advantage check on ``trainer`` (see the module docstring); returns paired differences
    ``true_vs_before``, ``shuffled_vs_before``, ``true_vs_shuffled`` and the base level. ``batches``
    (`collect_batches`), ``held`` and its ``base`` values may be passed to compare optimiser settings on the
    same rollouts and prompts."""
    if repeats < 1:
        raise ConfigError(f"expected repeats >= 1, got {repeats}")
    seed = trainer.cfg.seed if seed is None else seed
    learner = trainer.learner
    weights = copy.deepcopy(learner.model.state_dict())
    opt_state = copy.deepcopy(learner.optimizer.state_dict())
    held = held or HeldOut(trainer, tasks, samples, measure)
    base = held(_seed(seed, 0)) if base is None else base
    batches = list(batches) if batches is not None else collect_batches(trainer, repeats, seed)
    true_d, shuf_d, nodes, ratios = [], [], [], []
    try:
        for r, (samples_r, m) in enumerate(batches):
            nodes.append(len(samples_r))
            ratios.append(m["alloc/effective_ratio"])
            arms = {"true": samples_r, "shuffled": shuffled(samples_r, np.random.default_rng(_seed(seed, 2, r)))}
            for k, (name, arm) in enumerate(arms.items()):
                if arm:
                    learner.update(arm, _seed(seed, 3, r), trainer.tokenizer.pad_token_id)
                after = held(_seed(seed, 4, r, k))
                (true_d if name == "true" else shuf_d).append(after)
                learner.model.load_state_dict(weights)
                learner.optimizer.load_state_dict(copy.deepcopy(opt_state))
    finally:
        learner.model.load_state_dict(weights)
        learner.optimizer.load_state_dict(opt_state)
    t_mean, s_mean = np.mean(true_d, axis=0), np.mean(shuf_d, axis=0)
    return {"measure": held.measure, "tasks": len(base), "samples": held.samples if held.measure == "sampled" else 0,
            "repeats": len(batches), "before": float(base.mean()), "true": float(t_mean.mean()),
            "shuffled": float(s_mean.mean()), "true_vs_before": PairedDiff.of(t_mean - base),
            "shuffled_vs_before": PairedDiff.of(s_mean - base), "true_vs_shuffled": PairedDiff.of(t_mean - s_mean),
            "nodes": float(np.mean(nodes)), "effective_ratio": float(np.mean(ratios))}
