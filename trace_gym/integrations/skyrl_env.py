"""A trace-gym env as a skyrl-gym env: `TraceGymSkyRLEnv`, registered as ``trace-gym`` in skyrl-gym's registry.

skyrl-train (and any loop written against skyrl-gym) builds an env per dataset row,
``skyrl_gym.make(env_class, env_config=..., extras=...)``, calls ``init(prompt)`` and then
``step(assistant_text)`` until ``done``. The rows follow skyrl-train's dataset form: a ``prompt`` column (chat
messages), an ``env_class`` column, and every other column handed to the env as its extras (skyrl-train 0.3's
``PromptDataset`` does so, and its generator adds ``max_turns``); ``env_config`` is the operator's
``environment.skyrl_gym.<env_class>`` section. `skyrl_rows` writes such rows from any env spec: ``prompt`` (the
env's system and user messages), ``env_class: trace-gym``, ``task_id``, ``data_source`` (the env spec, which
skyrl-train's evaluation groups its metrics by) and ``reward_spec`` (``{"method": "rule", "ground_truth": the
task's gold answer as text}``, the form skyrl-train's datasets carry; the env scores with its own verifier and
never reads it).

Several envs: ``env_config`` may instead hold ``envs: {key: {env: SPEC, env_args: {...}}}``, the operator's envs
under keys of the operator's choice, and each row then names one of them by its ``env_key`` extra
(``skyrl_rows(..., env_key=key)`` writes it, and makes the key the row's ``data_source``, so skyrl-train reports
each env apart); a key the operator did not give is refused, so a row still picks among the operator's envs only.

The operator chooses the env, a row only its task: ``env`` (a spec) and ``env_args`` come from ``env_config``
alone, since a spec may name any importable ``module:Class`` and the args a ``data_path`` to read; extras that
try to set them are refused. Of the extras only ``task_id`` is read; the rest (the prompt, skyrl-train's
``max_turns``, a dataset's own columns) are ignored: the env keeps its own turn limit.

``init`` starts the row's task and returns the env's own first messages (its system prompt and the task), each
``step`` returns the env's reply messages (tool results keep the ``tool`` role) and the episode's reward on the
turn that ends it. Beyond skyrl-gym's interface, ``snapshot()``/``restore(handle)`` branch the episode (a host
that wants trees can use them; skyrl-gym itself never calls them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import register, registry

from trace_gym.env_mix import KEY
from trace_gym.errors import ConfigError
from trace_gym.integrations.session import EnvSession

__all__ = ["ENV_CLASS", "TraceGymSkyRLEnv", "register_skyrl", "skyrl_rows"]

ENV_CLASS = "trace-gym"
ROW_CHOOSES_ENV = frozenset({"env", "envs", "env_args", "env_kwargs", "env_extras", "env_config", "spec",
                             "data_path"})
"""Extras keys that would choose the env or its arguments: a data row may not."""


class TraceGymSkyRLEnv(BaseTextEnv):
    """skyrl-gym's text env over one trace-gym env (module docstring): ``env_config`` (the operator's) names
    ``env`` and ``env_args``, a row's ``extras`` the ``task_id``."""

    def __init__(self, env_config: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None):
        super().__init__()
        settings = _plain(env_config or {})
        row = dict(extras or {})
        chosen = sorted(ROW_CHOOSES_ENV & set(row))
        if chosen:
            raise ConfigError(f"expected a data row to pick a task only (its task_id), got extras {chosen} that "
                              "would choose the env or its arguments; fix: set env and env_args in env_config (in "
                              f"skyrl-train: environment.skyrl_gym.{ENV_CLASS}.env and .env_args) and build rows "
                              "with trace_gym.integrations.skyrl_env.skyrl_rows")
        if "envs" in settings:
            settings = _operator_env(settings, row.get("env_key"))
        elif "env_key" in row:
            raise ConfigError(f"expected no env_key in a row of a single-env env_config, got {row['env_key']!r}; "
                              f"fix: list the envs in env_config (envs: {{key: {{env: SPEC, env_args: {{...}}}}}})")
        if not isinstance(settings.get("env"), str):
            raise ConfigError(f"expected env_config to name the env (env: SPEC, env_args: {{...}}), got keys "
                              f"{sorted(settings)}; fix: in skyrl-train set +environment.skyrl_gym.{ENV_CLASS}.env="
                              "trace/Arithmetic-v0 (and .env_args); in Python skyrl_gym.make(..., env_config="
                              "{'env': SPEC, 'env_args': {...}})")
        unknown = sorted(set(settings) - {"env", "env_args"})
        if unknown:
            raise ConfigError(f"expected env_config keys env and env_args, got also {unknown}; fix: put the env's "
                              "own settings inside env_args")
        if not isinstance(row.get("task_id"), str):
            raise ConfigError(f"expected the row's extras to name its task_id, got keys {sorted(row)}; fix: build "
                              "rows with trace_gym.integrations.skyrl_env.skyrl_rows (a task_id column)")
        self.session = EnvSession(settings["env"], settings.get("env_args") or {})
        self.task_id: str = row["task_id"]
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


def skyrl_rows(spec: str, env_args: Mapping[str, Any] | None = None, tasks: int | None = None,
               env_key: str | None = None) -> list[dict[str, Any]]:
    """Dataset rows in skyrl-train's form for the first ``tasks`` tasks of ``spec`` (all by default): ``prompt``
    (the env's first messages), ``env_class``, ``task_id``, ``data_source`` and ``reward_spec`` (module
    docstring), and ``env_key`` when given (the operator's key of this env in an ``envs`` env_config, then also
    the ``data_source``); the env itself goes in the operator's ``env_config``."""
    if env_key is not None and not KEY.match(env_key):
        raise ConfigError(f"expected an env key of letters, digits, '_', '.' or '-', got {env_key!r}; fix: a short "
                          "word such as 'math'")
    session = EnvSession(spec, env_args)
    try:
        rows = []
        for task in list(session.base.tasks)[:tasks]:
            messages = session.reset(task_id=task.id)["messages"]
            rows.append({"prompt": messages, "env_class": ENV_CLASS, "task_id": task.id,
                         "data_source": spec if env_key is None else env_key,
                         "reward_spec": {"method": "rule", "ground_truth": _text(task.answer)},
                         **({"env_key": env_key} if env_key is not None else {})})
        return rows
    finally:
        session.close()


def _operator_env(settings: Mapping[str, Any], key: Any) -> dict[str, Any]:
    """The ``{env, env_args}`` of the operator's env that a row's ``env_key`` names (module docstring)."""
    envs = settings["envs"]
    if set(settings) != {"envs"} or not isinstance(envs, Mapping) or not envs:
        raise ConfigError(f"expected env_config as envs: {{key: {{env: SPEC, env_args: {{...}}}}}} alone, got keys "
                          f"{sorted(settings)}; fix: put every env under envs, or use env and env_args for one env")
    if not isinstance(key, str) or key not in envs:
        raise ConfigError(f"expected the row's env_key to name one of the operator's envs {sorted(envs)}, got "
                          f"{str(key)[:80]!r}; fix: build each env's rows with skyrl_rows(spec, env_args, "
                          "env_key=KEY) under the key env_config gives it")
    chosen = envs[key]
    if not isinstance(chosen, Mapping):
        raise ConfigError(f"expected envs.{key} as {{env: SPEC, env_args: {{...}}}}, got {chosen!r}")
    return dict(chosen)


def _text(answer: Any) -> str:
    """A gold answer as one string (a parquet column holds one type): text as is, anything else as JSON."""
    return answer if isinstance(answer, str) else json.dumps(answer, sort_keys=True, default=str)


def _plain(value: Any) -> Any:
    """``value`` as plain dicts and lists (skyrl-train's env_config is an omegaconf DictConfig)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_plain(v) for v in value]
    return value


register_skyrl()
