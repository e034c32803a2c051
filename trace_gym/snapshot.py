"""Snapshots of an episode: capture everything that affects future observations and rewards, restore exactly.

Two mechanisms keep one contract (restore k times -> k identical, independent branches; nothing done after a
restore changes a snapshot):
- ``ReplaySnapshot``: portable. Task, the RNG state after reset, and the actions so far; restore = begin the
  task again and replay. Works across instances and processes (it pickles) for every env.
- ``NativeSnapshot``: fast. A deep copy of the episode state. Envs holding OS resources (a sandbox process)
  subclass it; those must free their resources in ``release()`` and on garbage collection, and a released one
  still restores (slower: it rebuilds what it freed, e.g. by re-running the sandbox's cells).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from trace_gym.errors import SnapshotError
from trace_gym.tasks import Task

SnapshotKind = Literal["native", "replay"]
"""How a tree rollout snapshots its nodes: ``NativeSnapshot`` (a copy of the state) or ``ReplaySnapshot``."""


class Restorable(Protocol):
    """The episode-state interface of ``trace_gym.env.TextEnv`` that snapshots read and restore (declared here, so
    that this module does not import the env module that imports it)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def base_state(self) -> dict[str, Any]: ...

    def load_base_state(self, state: Mapping[str, Any]) -> None: ...

    def replay(self, task: Task, rng_state: dict[str, Any], actions: Sequence[str]) -> tuple[str, dict[str, Any]]: ...

    def current(self) -> tuple[str, dict[str, Any]]: ...


@runtime_checkable
class Snapshot(Protocol):
    """A frozen episode state. ``restore_into`` must leave the snapshot reusable."""

    @property
    def kind(self) -> str: ...

    def restore_into(self, env: Restorable) -> tuple[str, dict[str, Any]]: ...

    def release(self) -> None: ...


def _check_owner(owner: str, env: Restorable) -> None:
    if owner != type(env).__qualname__:
        raise SnapshotError(f"expected an env of type {owner}, got {type(env).__qualname__}; "
                            "restore a snapshot into an instance of the env that took it")


@dataclass(frozen=True)
class ReplaySnapshot:
    """Portable: replays ``actions`` from the start of ``task``."""

    owner: str
    task: Task
    rng_state: dict[str, Any]
    actions: tuple[str, ...]
    kind: str = field(default="replay", init=False)

    def restore_into(self, env: Restorable) -> tuple[str, dict[str, Any]]:
        """Replay the actions from the start of the task in ``env`` (same env class); its observation and info."""
        _check_owner(self.owner, env)
        return env.replay(self.task, copy.deepcopy(self.rng_state), self.actions)

    def release(self) -> None:
        """Nothing to free."""


class NativeSnapshot:
    """A deep copy of the base episode fields plus ``env.state_dict()``."""

    kind = "native"

    def __init__(self, env: Restorable):
        self.owner = type(env).__qualname__
        self._state = copy.deepcopy((env.base_state(), env.state_dict()))

    def restore_into(self, env: Restorable) -> tuple[str, dict[str, Any]]:
        """Load the copied state into ``env`` (same env class); its observation and info. The snapshot is reusable."""
        _check_owner(self.owner, env)
        base, extra = copy.deepcopy(self._state)
        env.load_base_state(base)
        env.load_state_dict(extra)
        return env.current()

    def release(self) -> None:
        """Nothing to free: the copy is ordinary memory."""
