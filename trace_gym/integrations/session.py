"""`EnvSession`: one trace-gym env (any env spec, a user's own included, or an `EnvFactory`) played by text turns
from outside the project's collector: what the framework adapters and the env server drive.

``reset`` starts a task (by id, index or seed) and returns the chat so far; ``step`` plays one assistant turn and
returns what the env answered (its new messages, reward, whether the episode ended); ``snapshot`` returns a
handle to a native snapshot of the episode, which ``restore`` brings back any number of times (branches of a
tree) until ``release``. Results are plain JSON-ready data.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from typing import Any

from trace_gym.env import TextEnv
from trace_gym.env_specs import EnvFactory, env_factory
from trace_gym.errors import ConfigError
from trace_gym.snapshot import Snapshot

__all__ = ["EnvSession", "jsonable"]

MAX_SNAPSHOTS = 1024


def jsonable(value: Any) -> Any:
    """``value`` as JSON data (anything JSON cannot hold becomes its ``str``)."""
    return json.loads(json.dumps(value, default=str))


class EnvSession:
    """One env of ``spec`` built with ``env_args`` (or of an `EnvFactory`, which carries its own); ``max_snapshots``
    bounds the handles held at once."""

    def __init__(self, spec: str | EnvFactory, env_args: Mapping[str, Any] | None = None,
                 max_snapshots: int = MAX_SNAPSHOTS):
        factory = spec if isinstance(spec, EnvFactory) else env_factory(spec, env_args)
        self.spec, self.env_args = factory.spec, dict(factory.kwargs)
        self.env = factory()
        base = self.env.unwrapped
        if not isinstance(base, TextEnv):
            self.env.close()
            raise ConfigError(f"expected {spec} to be a trace_gym TextEnv, got {type(base).__name__}; fix: subclass "
                              "trace_gym.ToolEnv (README: a new env)")
        self.base: TextEnv = base
        self.max_snapshots = max_snapshots
        self._snapshots: dict[str, Snapshot] = {}
        self._ids = itertools.count()

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The env's tool schemas in the OpenAI form (empty for an env without declared tools)."""
        return [t.schema() for t in getattr(self.base, "tool_map", {}).values()]

    def reset(self, task_id: str | None = None, index: int | None = None, seed: int | None = None) -> dict[str, Any]:
        """Start the task ``task_id`` (else the ``index``-th, else one drawn with ``seed``): the first observation,
        the messages so far (system and user), the task id and the tools."""
        options: dict[str, Any] = {}
        if task_id is not None:
            options["task_id"] = task_id
        elif index is not None:
            options["index"] = int(index)
        obs, info = self.env.reset(seed=seed, options=options)
        return {"observation": obs, "messages": jsonable(info["messages"]), "task_id": info["task_id"],
                "tools": self.tools}

    def step(self, action: str) -> dict[str, Any]:
        """Play the assistant turn ``action``: the env's answer (observation and the messages it added after the
        turn), the reward, ``terminated``/``truncated``/``done`` and the rest of ``info``."""
        if not isinstance(action, str):
            raise ConfigError(f"expected the action as a string, got {type(action).__name__}")
        before = len(self.base.messages)
        obs, reward, terminated, truncated, info = self.env.step(action)
        messages = info.pop("messages")
        return {"observation": obs, "reward": float(reward), "terminated": bool(terminated),
                "truncated": bool(truncated), "done": bool(terminated or truncated),
                "new_messages": jsonable(messages[before + 1:]), "info": jsonable(info)}

    @property
    def held(self) -> int:
        """How many snapshot handles are held now."""
        return len(self._snapshots)

    def messages(self) -> list[dict[str, Any]]:
        """The whole chat of the episode so far."""
        return jsonable(self.base.messages)

    def snapshot(self) -> str:
        """A handle to a native snapshot of the episode now."""
        if len(self._snapshots) >= self.max_snapshots:
            raise ConfigError(f"expected at most {self.max_snapshots} snapshots held at once, got one more; fix: "
                              "release the handles of branches you are done with")
        handle = f"s{next(self._ids)}"
        self._snapshots[handle] = self.base.snapshot("native")
        return handle

    def restore(self, handle: str, source: EnvSession | None = None) -> dict[str, Any]:
        """Back to the snapshot ``handle`` (it stays valid): the observation and the messages there. ``source``:
        the session holding the handle when it is another one (a branch: an env of the same class)."""
        snapshot = (source or self)._snapshot(handle)
        if self.base.task is None:  # a fresh env: gymnasium's wrappers refuse a step before its first reset
            self.env.reset()
        obs, info = self.base.restore(snapshot)
        return {"observation": obs, "messages": jsonable(info.get("messages", self.base.messages)),
                "task_id": info.get("task_id"), "done": bool(self.base.done)}

    def release(self, handle: str) -> None:
        """Free the snapshot ``handle``."""
        self._snapshot(handle).release()
        del self._snapshots[handle]

    def close(self) -> None:
        """Release every snapshot and close the env."""
        for snap in self._snapshots.values():
            snap.release()
        self._snapshots.clear()
        self.env.close()

    def _snapshot(self, handle: str) -> Snapshot:
        try:
            return self._snapshots[handle]
        except KeyError:
            raise ConfigError(f"expected a snapshot handle of this EnvSession, got {handle!r} (held: "
                              f"{', '.join(self._snapshots) or 'none'}); fix: use the handle snapshot returned"
                              ) from None
