"""Several envs in one training run (`env.mix`): the envs, the prompt stream across them, per-env figures.

A mixed run's tasks carry namespaced ids (``"<env>/<task id>"``, `trace_gym.env_mix`), so the collector, the
allocator and the predictor see one pool of prompts, and every figure splits by env from the ids alone.

Choices:
1. Each step's candidate pool is drawn across envs by weight with a deterministic interleave
   (`env_mix.weighted_order`): every env's count stays within one of its share over any run of steps, and its
   prompts come from its own seeded per-epoch shuffle (a `TaskStream` per env, seeded by (seed, entry index)),
   so a resumed run continues the same sequence from the per-env positions alone.
2. Held-out evaluation takes the first ``eval.tasks`` prompts of each env's evaluation split, so a weight never
   starves an env's held-out figure.
3. The warm start imitates ``sft.episodes`` expert episodes shared by weight (`EnvMix.split`), each env's expert
   with its entry's ``expert`` keywords or ``sft.expert``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from trace_gym.env_mix import EnvMix, env_of, per_env, weighted_order
from trace_gym.errors import ConfigError
from trace_gym.limits import Footprint
from trace_gym.seeds import derive
from trace_gym.tasks import Task
from trace_gym.training.allocation.metrics import tree_metrics
from trace_gym.training.config import EnvConfig, TrainConfig
from trace_gym.tree import RolloutTree

PER_ENV_KEYS = ("rollout/prompts", "rollout/trajectories", "rollout/success", "rollout/tokens",
                "alloc/effective_ratio")
"""The step metrics also reported per env, as ``<namespace>/<env>/<name>`` (``rollout/Arithmetic/success``)."""


class Stream(Protocol):
    tasks: list[Task]
    position: int

    def take(self, n: int) -> list[Task]: ...


def make_mix(env: EnvConfig, evaluation: bool = False) -> EnvMix:
    """The training (or held-out evaluation) envs of ``env.mix``, by entry name."""
    return EnvMix.of({e.key_name: (e.id, {**e.kwargs, **(e.eval_kwargs if evaluation else {})}, e.weight)
                      for e in env.mix})


class MixedStream:
    """Training prompts of several envs, drawn by weight (choice 1); ``positions`` is all the state there is."""

    def __init__(self, streams: Mapping[str, Stream], weights: Mapping[str, float]):
        self.streams, self.weights = dict(streams), dict(weights)
        self.tasks: list[Task] = [t for s in self.streams.values() for t in s.tasks]

    @classmethod
    def of(cls, mix: EnvMix, seed: int, stream: Callable[[Sequence[Task], int], Stream]) -> MixedStream:
        """One ``stream(tasks, seed)`` per env of ``mix`` (the trainer's `TaskStream`), seeded per entry."""
        return cls({k: stream(ts, derive(seed, i)) for i, (k, ts) in enumerate(mix.tasks().items())}, mix.weights)

    @property
    def position(self) -> int:
        """Prompts drawn so far, over all envs."""
        return sum(self.positions.values())

    @property
    def positions(self) -> dict[str, int]:
        return {k: s.position for k, s in self.streams.items()}

    @positions.setter
    def positions(self, value: Mapping[str, int]) -> None:
        if set(value) != set(self.streams):
            raise ConfigError(f"expected data positions of the envs {sorted(self.streams)}, got {sorted(value)}; "
                              "fix: resume with the env.mix the run was started with")
        for k, p in value.items():
            self.streams[k].position = int(p)

    def take(self, n: int) -> list[Task]:
        order = weighted_order(self.weights, self.positions, n)
        drawn = {k: iter(self.streams[k].take(order.count(k))) for k in self.streams}
        return [next(drawn[k]) for k in order]

    def check_pool(self, pool_size: int) -> None:
        """Each env holds at least its share of a pool (so a pool never repeats one of its prompts)."""
        total = sum(self.weights.values())
        for k, s in self.streams.items():
            need = math.ceil(pool_size * self.weights[k] / total)
            if len(s.tasks) < need:
                raise ConfigError(f"expected env {k!r} of env.mix to hold its share of alloc.pool_size ({need} "
                                  f"prompts), got {len(s.tasks)}; fix: give it more tasks or lower its weight or "
                                  "alloc.pool_size")


def eval_tasks(mix: EnvMix, n: int) -> list[Task]:
    """The first ``n`` held-out prompts of each env (choice 2), namespaced."""
    return [t for ts in mix.tasks().values() for t in ts[:n]] if n else []


def rollout_metrics(pool: Sequence[Task], trees: Mapping[str, RolloutTree],
                    advantages: Mapping[str, Mapping[int, float]]) -> dict[str, float]:
    """Per env: its candidates in the step's ``pool`` (``alloc/<env>/pool``) and `PER_ENV_KEYS` of its trees (an
    env the allocator gave no rollout has none)."""
    out = {f"alloc/{env}/pool": float(n) for env, n in Counter(env_of(t.id) for t in pool).items()}
    groups: dict[str, list[str]] = {}
    for tid in trees:
        groups.setdefault(env_of(tid), []).append(tid)
    for env, tids in groups.items():
        m = tree_metrics([trees[t] for t in tids], [advantages.get(t, {}) for t in tids])
        out.update({_per_env(k, env): m[k] for k in PER_ENV_KEYS if k in m})
    return out


def eval_metrics(tasks: Sequence[Task], per_prompt: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each held-out measure's mean per env, ``eval/<env>/<measure>`` (NaN prompts left out)."""
    out = {}
    for measure, values in per_prompt.items():
        for env, vals in per_env([t.id for t in tasks], values).items():
            finite = [v for v in vals if math.isfinite(v)]
            out[f"eval/{env}/{measure}"] = float(np.mean(finite)) if finite else float("nan")
    return out


def summary(tasks: Sequence[Task], first: Mapping[str, Sequence[float]] | None,
            last: Mapping[str, Sequence[float]] | None) -> dict[str, dict[str, float | None]]:
    """Held-out success before and after per env, for summary.json: ``{env: {success_before, success_after}}``."""
    before = eval_metrics(tasks, {"success": (first or {}).get("success", [])}) if first else {}
    after = eval_metrics(tasks, {"success": (last or {}).get("success", [])}) if last else {}
    envs = dict.fromkeys(env_of(t.id) for t in tasks)
    return {e: {"success_before": before.get(f"eval/{e}/success"), "success_after": after.get(f"eval/{e}/success"),
                "tasks": sum(env_of(t.id) == e for t in tasks)} for e in envs}


def expert_sequences(mix: EnvMix, tasks: Sequence[Task], tokenizer: Any) -> list[tuple[list[int], list[bool]]]:
    """`evaluate.expert_sequences` of ``tasks`` from several envs, each on its own env, in the order of ``tasks``."""
    from trace_gym.training.rollout.evaluate import expert_sequences as one_env

    out: dict[str, tuple[list[int], list[bool]]] = {}
    for env in dict.fromkeys(env_of(t.id) for t in tasks):
        chosen = [t for t in tasks if env_of(t.id) == env]
        out.update(zip([t.id for t in chosen], one_env(mix.factory(env), chosen, tokenizer), strict=True))
    return [out[t.id] for t in tasks]


def expert_episodes(cfg: TrainConfig, mix: EnvMix, collect_expert_episodes: Callable[..., list[list[dict[str, Any]]]]
                    ) -> list[list[dict[str, Any]]]:
    """The warm start's expert episodes over the mix (choice 3), each env's collected by
    ``collect_expert_episodes`` (`warm_start.collect_expert_episodes`, which imports this module)."""
    options = {e.key_name: e.expert for e in cfg.env.mix}
    episodes = []
    for env, n in mix.split(cfg.sft.episodes).items():
        if n:
            expert = options[env] if options[env] is not None else cfg.sft.expert
            episodes += collect_expert_episodes(mix.factory(env), n, noise=cfg.sft.noise, seed=cfg.seed,
                                                expert=expert)
    return episodes


def footprint(classes: Sequence[type | None], branching: bool) -> Footprint | None:
    """The heaviest per-trajectory host footprint among the envs' classes (a step may spend all its budget on
    one env), each measure on its own; None when no env declares one."""
    from trace_gym.env import TextEnv

    prints = [c.host_footprint(branching) for c in classes if c is not None and issubclass(c, TextEnv)]
    prints = [p for p in prints if p is not None]
    if not prints:
        return None
    return Footprint(*(max(getattr(p, f) for p in prints) for f in ("processes", "descriptors", "namespaces",
                                                                       "memory_bytes")))


def _per_env(key: str, env: str) -> str:
    ns, name = key.split("/", 1)
    return f"{ns}/{env}/{name}"


__all__ = ["PER_ENV_KEYS", "MixedStream", "eval_metrics", "eval_tasks", "expert_episodes", "expert_sequences",
           "footprint", "make_mix", "rollout_metrics", "summary"]
