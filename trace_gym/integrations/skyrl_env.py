"""A trace-gym env as a skyrl-gym env: `TraceGymSkyRLEnv`, registered as ``trace-gym`` in skyrl-gym's registry.

skyrl-gym builds an env per dataset row, ``skyrl_gym.make("trace-gym", env_config=..., extras=row)``, calls
``init(prompt)`` and then ``step(assistant_text)`` until ``done``. Here the row's extras name the env and the
task (`skyrl_rows` writes such rows from any env spec): ``{"env": SPEC, "env_args": {...}, "task_id": ID}``;
``init`` starts that task and returns the env's own first messages (its system prompt and the task), each
``step`` returns the env's reply messages (tool results keep the ``tool`` role) and the episode's reward on the
turn that ends it. Beyond skyrl-gym's interface, ``snapshot()``/``restore(handle)`` branch the episode (a host
that wants trees can use them; skyrl-gym itself never calls them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import register, registry

from trace_gym.errors import ConfigError
from trace_gym.integrations.session import EnvSession

__all__ = ["ENV_CLASS", "TraceGymSkyRLEnv", "register_skyrl", "skyrl_rows"]

ENV_CLASS = "trace-gym"


class TraceGymSkyRLEnv(BaseTextEnv):
    """skyrl-gym's text env over one trace-gym env (module docstring). ``env_config`` may give ``env`` and
    ``env_args`` for every row; a row's extras override them and name the ``task_id``."""

    def __init__(self, env_config: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None):
        super().__init__()
        settings = {**dict(env_config or {}), **dict(extras or {})}
        if not isinstance(settings.get("env"), str):
            raise ConfigError(f"expected the row's extras (or env_config) to name the env, got keys "
                              f"{sorted(settings)}; fix: build rows with trace_gym.integrations.skyrl_env.skyrl_rows")
        self.session = EnvSession(settings["env"], settings.get("env_args") or {})
        self.task_id = settings.get("task_id")
        self.max_turns = self.session.base.max_turns
        self.reward = 0.0

    def init(self, prompt: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Start the row's task; the env's first messages (they replace the row's ``prompt``, which names the
        same task) and ``{"task_id", "tools"}``."""
        out = self.session.reset(task_id=self.task_id)
        self.turns, self.reward = 0, 0.0
        return out["messages"], {"task_id": out["task_id"], "tools": out["tools"]}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        out = self.session.step(action)
        self.turns += 1
        self.reward = out["reward"]
        observations = out["new_messages"] or ([] if out["done"] else [{"role": "user",
                                                                         "content": out["observation"]}])
        return BaseTextEnvStepOutput(observations=[] if out["done"] else observations, reward=out["reward"],
                                     done=out["done"], metadata=out["info"], postprocessed_action=action)

    def snapshot(self) -> str:
        """A handle to the episode now (`EnvSession.snapshot`)."""
        return self.session.snapshot()

    def restore(self, handle: str) -> list[dict[str, Any]]:
        """Back to ``handle``; the chat there."""
        out = self.session.restore(handle)
        self.turns = self.session.base.turn_count
        return out["messages"]

    def get_metrics(self) -> dict[str, Any]:
        return {"turns": self.turns, "reward": self.reward}

    def close(self) -> None:
        self.session.close()


def register_skyrl() -> str:
    """Register `TraceGymSkyRLEnv` with skyrl-gym as ``trace-gym`` (once); returns the id."""
    if ENV_CLASS not in registry:
        register(id=ENV_CLASS, entry_point=TraceGymSkyRLEnv)
    return ENV_CLASS


def skyrl_rows(spec: str, env_args: Mapping[str, Any] | None = None, tasks: int | None = None
               ) -> list[dict[str, Any]]:
    """Dataset rows in skyrl's form for the first ``tasks`` tasks of ``spec`` (all by default): the prompt
    messages, ``env_class`` and the extras that name the env and the task."""
    session = EnvSession(spec, env_args)
    try:
        rows = []
        for task in list(session.base.tasks)[:tasks]:
            messages = session.reset(task_id=task.id)["messages"]
            rows.append({"prompt": messages, "env_class": ENV_CLASS,
                         "env_extras": {"env": spec, "env_args": dict(env_args or {}), "task_id": task.id}})
        return rows
    finally:
        session.close()


register_skyrl()
