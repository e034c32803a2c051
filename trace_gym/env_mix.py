"""Several envs in one run: the operator's named envs, each a spec, its arguments and a weight.

A mix is the operator's choice, never a data row's: a row (a TRL prompt, a skyrl extras dict, verifiers task data)
may name one of the operator's envs by the key the operator gave it, and `EnvMix.factory` refuses any other key,
so a row never reaches an env id, a module or a file path of its own.

Task ids are namespaced by the env's key, ``"<key>/<task id>"`` (`qualify`), so that the tasks of several envs
share one collector (whose trees are keyed by task id) and every consumer reads a task's env back from its id
(`env_of`). A key is a short word (letters, digits, ``_``, ``.``, ``-``): the first ``/`` of a namespaced id ends it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trace_gym.env_specs import EnvFactory, env_factory
from trace_gym.errors import ConfigError
from trace_gym.tasks import Task

__all__ = ["KEY", "SEP", "EnvMix", "env_of", "per_env", "qualify", "short_name", "weighted_order"]

SEP = "/"
KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""What an env's key may be: a short word, never a path or a spec."""


def short_name(spec: str) -> str:
    """A spec's default key: its last name without the version, ``trace/Arithmetic-v0`` -> ``Arithmetic``,
    ``my_envs:CapitalsEnv`` -> ``CapitalsEnv``."""
    tail = re.split(r"[/:]", spec)[-1]
    return re.sub(r"-v\d+$", "", tail) or spec


def qualify(key: str, task: Task) -> Task:
    """``task`` with its id namespaced by the env key ``key``."""
    return dataclasses.replace(task, id=f"{key}{SEP}{task.id}")


def env_of(task_id: str) -> str:
    """The env key of a namespaced task id (``"Arithmetic/train-3"`` -> ``"Arithmetic"``)."""
    return task_id.split(SEP, 1)[0]


@dataclass(frozen=True)
class EnvMix:
    """The operator's envs by key: an `EnvFactory` and a weight each (weights need not sum to 1). Plain data of
    factories, so it pickles to rollout workers."""

    factories: Mapping[str, EnvFactory]
    weights: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.factories:
            raise ConfigError("expected at least one env in the mix, got none; fix: list envs as key: {env, weight}")
        for key in self.factories:
            if not KEY.match(key):
                raise ConfigError(f"expected an env key of letters, digits, '_', '.' or '-' (at most 64), got {key!r}; "
                                  "fix: name the env by a short word such as 'math'")
        weights = {k: float(self.weights.get(k, 1.0)) for k in self.factories}
        bad = {k: w for k, w in weights.items() if not (math.isfinite(w) and w > 0)}
        if bad:
            raise ConfigError(f"expected a finite weight > 0 for every env, got {bad}; fix: weight: 1.0")
        object.__setattr__(self, "weights", weights)

    @classmethod
    def of(cls, envs: Mapping[str, tuple[str, Mapping[str, Any] | None, float]]) -> EnvMix:
        """A mix from ``{key: (spec, kwargs, weight)}``; each spec is resolved now (a wrong one fails here)."""
        return cls({k: env_factory(spec, kwargs) for k, (spec, kwargs, _) in envs.items()},
                   {k: w for k, (_, _, w) in envs.items()})

    def __iter__(self) -> Iterator[str]:
        return iter(self.factories)

    def __len__(self) -> int:
        return len(self.factories)

    @property
    def keys(self) -> list[str]:
        """The env keys, in the operator's order."""
        return list(self.factories)

    def factory(self, key: str) -> EnvFactory:
        """The factory of the env ``key`` names; `ConfigError` for a key the operator did not give."""
        try:
            return self.factories[key]
        except KeyError:
            raise ConfigError(f"expected one of the operator's env keys {self.keys}, got {str(key)[:80]!r}; fix: "
                              "name an env the operator configured (a row picks among them, never a new env)") from None

    def factory_of(self, task_id: str) -> EnvFactory:
        """The factory of a namespaced task's env."""
        return self.factory(env_of(task_id))

    def tasks(self) -> dict[str, list[Task]]:
        """Each env's tasks, in order, with namespaced ids."""
        return {k: [qualify(k, t) for t in f.tasks()] for k, f in self.factories.items()}

    def split(self, n: int) -> dict[str, int]:
        """``n`` items shared by weight, largest remainders first (ties in the operator's order); sums to ``n``."""
        total = sum(self.weights.values())
        exact = {k: n * w / total for k, w in self.weights.items()}
        out = {k: math.floor(v) for k, v in exact.items()}
        for k in sorted(exact, key=lambda k: out[k] - exact[k])[:n - sum(out.values())]:
            out[k] += 1
        return out

    def close(self) -> None:
        for f in self.factories.values():
            f.close()


def weighted_order(weights: Mapping[str, float], drawn: Mapping[str, int], n: int) -> list[str]:
    """The next ``n`` env keys of a deterministic weighted interleave: each draw goes to the env furthest below
    its share (weight x draws so far, counting this one) given ``drawn`` (draws per env so far); ties go to the
    operator's order. Over any run of draws each env's count stays within one of its share, and the state is
    only the counts, so a resumed run continues the same sequence."""
    total = sum(weights.values())
    counts = {k: int(drawn.get(k, 0)) for k in weights}
    out = []
    for _ in range(n):
        done = sum(counts.values()) + 1
        key = max(weights, key=lambda k: weights[k] / total * done - counts[k])
        counts[key] += 1
        out.append(key)
    return out


def per_env(task_ids: Sequence[str], values: Sequence[float]) -> dict[str, list[float]]:
    """``values`` (one per task id) grouped by env key, in first-seen order."""
    out: dict[str, list[float]] = {}
    for tid, v in zip(task_ids, values, strict=True):
        out.setdefault(env_of(tid), []).append(float(v))
    return out
