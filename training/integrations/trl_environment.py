"""trace-gym envs inside TRL's ``GRPOTrainer`` through its ``environment_factory`` (the other way in, beside
`trl_rollout.TraceGymRollout`'s ``rollout_func``): TRL samples the turns and calls the env's tools itself, as
methods of an environment object, and the env verifies the final answer.

    Env = trl_environment("trace/Arithmetic-v0", {"n_tasks": 64})
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=Env.dataset(),
                          environment_factory=Env, reward_funcs=Env.reward)

TRL (1.16) builds one instance per rollout, calls ``reset(**row)`` with the row's columns, exposes every public
method but ``reset`` as a tool (its schema read from the method's signature and docstring by transformers'
``get_json_schema``), runs the tool calls the model writes through the chat template, and hands each reward
function the finished ``completions`` and ``environments``. Here:

- `trl_environment` returns a class whose tool methods are the env's tools: one method per tool, its
  parameters, types and descriptions taken from the tool's JSON schema. A call plays one turn of the env (the
  call written in the env's action format, `ToolFormat.action`) and returns the tool's result text.
- ``dataset()`` rows are ``prompt`` (the env's native system message, which leaves the tool schemas to the chat
  template, and the task) and ``task_id``, which ``reset`` starts.
- ``reward`` scores each rollout: the last assistant message without tool calls is the final answer the env
  verifies (`ToolFormat.answer`, as a served model's plain reply is); an episode the env already ended (its turn
  limit) keeps the env's reward.

Choices:
1. Each tool call is one env turn: TRL runs the calls of one assistant message one by one, so a message with
   two calls spends two of the env's ``max_turns``.
2. A tool whose name is not a Python identifier, or is ``reset``, cannot be a method: `ConfigError`.
3. JSON types map to Python's (string, integer, number, boolean, array, object); a parameter of several types
   or none is a string; an optional parameter defaults to None and is left out of the call when unset.
"""

from __future__ import annotations

import inspect
import itertools
import json
import keyword
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trace_gym.agents.native_tools import ToolFormat
from trace_gym.env_specs import env_factory
from trace_gym.errors import ConfigError
from trace_gym.integrations.session import EnvSession
from trace_gym.tools import Tool

__all__ = ["TraceGymEnvironment", "trl_environment"]

JSON_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                               "object": dict}


class TraceGymEnvironment:
    """One episode of a trace-gym env for TRL's ``environment_factory`` (module docstring); `trl_environment`
    makes the subclass of an env spec, with the env's tools as methods. TRL takes every public function of the
    class but ``reset`` as a tool, so the rest is private or a classmethod."""

    spec: str = ""
    env_args: Mapping[str, Any] = {}
    _format: ToolFormat

    def __init__(self) -> None:
        self.session = EnvSession(self.spec, self.env_args)
        self.done, self.env_reward, self.task_id = False, 0.0, ""
        self._ids = itertools.count()

    def reset(self, task_id: str | None = None, **row: Any) -> None:
        """Start the row's task (its ``task_id`` column, from `dataset`); the prompt is the row's own."""
        if task_id is None:
            raise ConfigError(f"expected a task_id column in the rows, got columns {sorted(row)}; fix: train on "
                              "Env.dataset()")
        self.task_id = self.session.reset(task_id=task_id)["task_id"]
        self.done, self.env_reward = False, 0.0

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        """Play the call as one env turn (choice 1); the tool's result text."""
        if self.done:
            return "The episode has ended; no more tool calls are run."
        call = {"id": f"call_{next(self._ids)}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}
        out = self.session.step(self._format.action({"role": "assistant", "content": None, "tool_calls": [call]}))
        self._end(out)
        results = [str(m.get("content", "")) for m in out["new_messages"] if m.get("role") == "tool"]
        return "\n".join(results) if results else str(out["observation"])

    def _finish(self, answer: str) -> float:
        """Give the env the final ``answer`` (unless the episode has ended); the episode's reward."""
        if not self.done:
            self._end(self.session.step(self._format.answer(answer)))
            self.done = True
        return self.env_reward

    def _end(self, out: Mapping[str, Any]) -> None:
        if out["done"]:
            self.done, self.env_reward = True, float(out["reward"])

    @classmethod
    def dataset(cls, tasks: int | None = None) -> Any:
        """A ``datasets.Dataset`` of the first ``tasks`` tasks (all by default): ``prompt`` (the env's native
        system message and the task) and ``task_id``."""
        from datasets import Dataset

        session = EnvSession(cls.spec, cls.env_args)
        try:
            rows = []
            for task in list(session.base.tasks)[:tasks]:
                messages = session.reset(task_id=task.id)["messages"]
                rows.append({"prompt": cls._format.wire_messages(messages), "task_id": task.id})
        finally:
            session.close()
        return Dataset.from_list(rows)

    @classmethod
    def reward(cls, completions: Sequence[Any], environments: Sequence[TraceGymEnvironment] | None = None,
               **kwargs: Any) -> list[float]:
        """The reward function to give ``GRPOTrainer``: each rollout's final answer verified by its env."""
        if environments is None:
            raise ConfigError("expected the rollouts' environments, got none; fix: pass the class from "
                              "trl_environment(...) as the trainer's environment_factory too")
        return [env._finish(_final_answer(completion)) for completion, env in zip(completions, environments,
                                                                                   strict=True)]

    def _close(self) -> None:
        self.session.close()

    def __del__(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            session.close()


def trl_environment(spec: str, env_args: Mapping[str, Any] | None = None) -> type[TraceGymEnvironment]:
    """The `TraceGymEnvironment` subclass for the env ``spec`` built with ``env_args``: its public methods are the
    env's tools (module docstring); pass it as ``environment_factory``."""
    factory = env_factory(spec, dict(env_args or {}))
    with factory.reading() as env:
        fmt = ToolFormat.of_env(env)
        name = type(env.unwrapped).__name__
    if fmt is None:
        raise ConfigError(f"expected an env with declared tools for TRL's environment_factory, got {spec} "
                          "without; fix: use TraceGymRollout (rollout_func), which plays any env")
    attrs: dict[str, Any] = {"spec": spec, "env_args": dict(env_args or {}), "_format": fmt,
                             "__doc__": f"{name} ({spec}) for TRL's environment_factory: its tools as methods."}
    for tool in fmt.tools:
        if not tool.name.isidentifier() or keyword.iskeyword(tool.name) or tool.name == "reset" or \
                hasattr(TraceGymEnvironment, tool.name):
            raise ConfigError(f"expected tool names that can be methods, got {tool.name!r} in {spec}; fix: use "
                              "TraceGymRollout (rollout_func), which plays any tool name")
        attrs[tool.name] = _method(tool)
    return type(f"{name}Environment", (TraceGymEnvironment,), attrs)


def _method(tool: Tool) -> Callable[..., str]:
    """The method that calls ``tool``: its signature, annotations and docstring from the tool's JSON schema, as
    transformers' ``get_json_schema`` reads them (choice 3)."""
    props: Mapping[str, Any] = tool.parameters.get("properties", {})
    required = set(tool.parameters.get("required", []))
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    args_doc = []
    for pname, schema in props.items():
        kind = JSON_TYPES.get(schema.get("type"), str) if isinstance(schema.get("type"), str) else str
        optional = pname not in required
        params.append(inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY, annotation=kind | None if optional
                                        else kind, default=None if optional else inspect.Parameter.empty))
        annotations[pname] = params[-1].annotation
        args_doc.append(f"    {pname}: {' '.join(str(schema.get('description') or pname).split())}")
    annotations["return"] = str

    def call(self: TraceGymEnvironment, **kwargs: Any) -> str:
        return self._call(tool.name, {k: v for k, v in kwargs.items() if v is not None})

    call.__name__ = call.__qualname__ = tool.name
    call.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    call.__annotations__ = annotations
    description = " ".join((tool.description or tool.name).split())
    call.__doc__ = description + ("\n\nArgs:\n" + "\n".join(args_doc) if args_doc else "")
    return call


def _final_answer(completion: Any) -> str:
    """The text of the last assistant message without tool calls (a conversational completion), or the
    completion itself (plain text)."""
    if isinstance(completion, str):
        return completion
    for message in reversed(list(completion)):
        if isinstance(message, Mapping) and message.get("role") == "assistant" and not message.get("tool_calls"):
            content = message.get("content")
            if isinstance(content, list):  # content blocks
                return "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))
            return str(content or "")
    return ""
