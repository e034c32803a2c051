"""Env specs: the one place where a string names an environment (``env.id`` of a training config, ``--env`` of
the commands).

Three forms:

- a registered id, ``trace/Arithmetic-v0`` (``trace-gym envs`` lists the trace ids) or any id registered with
  gymnasium before the call;
- gymnasium's ``module:id``, ``my_envs:my/Capitals-v0``: the module is imported first (it registers the id),
  as ``gym.make`` does;
- ``module:Class`` (or ``module:function``), ``my_envs:CapitalsEnv``: an env class or factory, used without
  registration.

A module is imported from the Python path or the current directory (as ``python -m`` would find it). A
``module:NAME`` is an attribute of the module when it has one, else an id the module registered.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

from trace_gym.errors import ConfigError, nearest
from trace_gym.experts import Expert
from trace_gym.tasks import Task

FORMS = "a registered id (trace-gym envs lists them), module:id or module:Class"


@dataclass(frozen=True)
class EnvFactory:
    """``EnvFactory(spec, kwargs)()`` makes a fresh env. The factory also answers what callers ask of the env,
    so that none builds a throwaway env of its own: its class (`env_class`, no env built), its tasks (`tasks`,
    read once) and its scripted expert (`expert`, from one env it builds on first need and holds until
    `close`). Plain data, so it pickles to worker processes (which resolve the spec again, importing its module
    there); `EnvFactory.of` wraps any env-making callable (which then stays in this process)."""

    spec: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    build: Callable[[], gym.Env] | None = field(default=None, compare=False, repr=False)
    """A callable that makes the env instead of the spec (`of`)."""
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, make_env: Callable[[], gym.Env]) -> EnvFactory:
        """``make_env`` itself when it is a factory, else a factory around it."""
        return make_env if isinstance(make_env, EnvFactory) else cls("", {}, build=make_env)

    def __call__(self) -> gym.Env:
        return self.build() if self.build is not None else make_env(self.spec, **dict(self.kwargs))

    def __getstate__(self) -> dict[str, Any]:
        if self.build is not None:
            raise TypeError("expected an EnvFactory of an env spec to send to another process, got one around a "
                            "callable; fix: name the env by a spec (env_factory(spec, kwargs))")
        return {"spec": self.spec, "kwargs": dict(self.kwargs), "build": None, "_cache": {}}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)

    @property
    def env_class(self) -> type[gym.Env] | None:
        """The env class the spec names, without building one (None for a factory function or a callable)."""
        return spec_class(self.spec) if self.build is None else None

    def tasks(self) -> list[Task]:
        """The env's tasks, in order (its ``tasks`` attribute), read once."""
        if "tasks" not in self._cache:
            held = "env" in self._cache
            env = self._env()
            self._cache["tasks"] = list(getattr(env.unwrapped, "tasks", None) or [])
            if not held:  # read and gone: only an expert keeps the env
                self.close()
        return list(self._cache["tasks"])

    @property
    def has_expert(self) -> bool:
        """Whether the env offers a scripted expert (``env.unwrapped.expert``)."""
        return callable(getattr(self._env().unwrapped, "expert", None))

    def expert(self, noise: float = 0.0, seed: int = 0, **options: Any) -> Expert:
        """The env's scripted expert (``expert(noise, seed, **options)``); `ConfigError` when it has none or does
        not take ``options``."""
        base = self._env().unwrapped
        make = getattr(base, "expert", None)
        if not callable(make):
            raise ConfigError(f"expected an env with a scripted expert, got {type(base).__name__} without one; "
                              "fix: use a model policy, or give the env an expert(noise, seed) method")
        try:
            return make(noise=noise, seed=seed, **options)
        except TypeError as exc:
            if not options or "unexpected keyword" not in str(exc):
                raise
            raise ConfigError(f"expected expert options that {type(base).__name__}.expert takes, got "
                              f"{sorted(options)} ({exc}); fix: drop them from sft.expert") from None

    @contextmanager
    def reading(self) -> Iterator[gym.Env]:
        """The env the factory holds for its answers, for a caller that reads more of it (its tool declarations and
        system message, a task's first messages after ``reset``); closed on leaving unless the factory held it
        already (for its expert). Nothing played on it counts: episodes run on envs the factory makes."""
        held = "env" in self._cache
        try:
            yield self._env()
        finally:
            if not held:
                self.close()

    def close(self) -> None:
        """Close the env the factory holds for its answers (a later question builds it again)."""
        env = self._cache.pop("env", None)
        if env is not None:
            env.close()

    def _env(self) -> gym.Env:
        if "env" not in self._cache:
            self._cache["env"] = self()
        return self._cache["env"]


def env_factory(spec: str, kwargs: Mapping[str, Any] | None = None) -> EnvFactory:
    """A factory of envs named by ``spec`` (any of the module docstring's forms) built with ``kwargs``. The
    spec is resolved now, so that a wrong one fails here with a message that says how to fix it."""
    resolve_env_spec(spec)
    return EnvFactory(spec, dict(kwargs or {}))


def parse_env_args(pairs: list[str]) -> dict[str, Any]:
    """``["n_tasks=50", "split=test"]`` -> ``{"n_tasks": 50, "split": "test"}`` (values read as YAML)."""
    import yaml

    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ConfigError(f"expected --env-arg KEY=VALUE, got {pair!r}; fix: e.g. --env-arg n_tasks=50")
        try:
            kwargs[key.strip()] = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError as exc:
            raise ConfigError(f"expected a YAML value in --env-arg {pair!r}, got {type(exc).__name__}; fix: quote "
                              f"it, e.g. --env-arg '{key}=\"{raw}\"'") from None
    return kwargs


def env_tasks(make_env: Callable[[], gym.Env]) -> list[Task]:
    """The tasks of the env ``make_env`` builds, in order (a factory's own answer when it is one)."""
    factory = EnvFactory.of(make_env)
    try:
        return factory.tasks()
    finally:
        if factory is not make_env:
            factory.close()


def spec_class(spec: str) -> type[gym.Env] | None:
    """The env class ``spec`` names (registered id, module:id or module:Class), without building an env; None
    when the entry point is a function."""
    entry = resolve_env_spec(spec).entry_point
    creator = entry if callable(entry) else _creator(resolve_env_spec(spec))
    return creator if isinstance(creator, type) and issubclass(creator, gym.Env) else None


def make_env(spec: str, **kwargs: Any) -> gym.Env:
    """``gym.make`` for every form of spec, with a clear error for a keyword argument the env does not take or a
    value of the wrong type (checked against the constructor's annotations: numbers, strings, flags, choices)."""
    env_spec = resolve_env_spec(spec)
    check_keyword_types(spec, _creator(env_spec), kwargs)
    try:
        return gym.make(env_spec, **kwargs)
    except TypeError as exc:
        bad = _unexpected_keyword(exc, kwargs, env_spec)
        if bad is None:
            raise
        creator = _creator(env_spec)
        accepted = _accepted_keywords(creator) or set()
        near = nearest(bad, _keywords_taking(creator, accepted, kwargs[bad]))
        hint = f"did you mean {near}? " if near else ""
        if near is None and "task" in bad and isinstance(kwargs[bad], int):
            hint = ("this env's tasks are its dataset's; to play fewer, ask the command (trace-gym eval and "
                    "rollout: --tasks N, the first N; vf-eval and vf-validate: -n N; trace-gym sft: --episodes N, "
                    "which cycle over the tasks); ")
        raise ConfigError(f"expected keyword arguments of {spec}, got unknown {bad}={kwargs[bad]!r}; fix: {hint}"
                          f"it takes {', '.join(sorted(accepted)) or 'none'}") from None


def resolve_env_spec(spec: str) -> EnvSpec:
    """The gymnasium ``EnvSpec`` that ``spec`` names; ``ConfigError`` (with the nearest valid name) if none."""
    import trace_gym  # noqa: F401 - registers the trace/* ids

    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"expected an env spec ({FORMS}), got {spec!r}; fix: e.g. trace/Arithmetic-v0")
    if ":" not in spec:
        if spec in gym.registry:
            return gym.registry[spec]
        raise _unknown_id(spec, spec)
    module_name, name = spec.split(":", 1)
    module = _import(module_name, spec)
    obj = getattr(module, name, None) if name.isidentifier() else None
    if obj is not None:
        if not callable(obj):
            raise ConfigError(f"expected {spec} to name an env class or a function returning an env, got a "
                              f"{type(obj).__name__}; fix: point at the class, e.g. {module_name}:MyEnv")
        return EnvSpec(id=name, entry_point=obj)
    if name in gym.registry:
        return gym.registry[name]
    envs_here = [k for k, v in vars(module).items() if isinstance(v, type) and issubclass(v, gym.Env)
                 and v.__module__ == module.__name__]
    near = nearest(name, [*envs_here, *gym.registry])
    hint = f"did you mean {module_name}:{near}? " if near else ""
    raise ConfigError(f"expected {name!r} to be a class of module {module_name!r} or an id it registers, got "
                      f"neither; fix: {hint}classes there: {', '.join(envs_here) or 'none'}")


def _unknown_id(name: str, spec: str) -> ConfigError:
    from trace_gym.registration import trace_env_ids

    near = nearest(name, gym.registry)
    if near is not None:
        return ConfigError(f"expected a registered env id, got {spec!r}; fix: did you mean {near!r}? "
                           "(trace-gym envs lists the trace ids; your own env: module:Class or module:id)")
    return ConfigError(f"expected a registered env id, got {spec!r}; fix: one of {', '.join(trace_env_ids())}, "
                       "or your own env as module:Class or module:id")


def _import(module_name: str, spec: str) -> ModuleType:
    # The console script's sys.path lacks the working directory; a user's env module usually lives there.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise  # the module exists but one of its own imports is missing: its traceback says which
        raise ConfigError(f"expected an importable module in env spec {spec!r}, got no module {exc.name!r}; "
                          f"fix: run from the folder holding {module_name.replace('.', '/')}.py or add that "
                          "folder to PYTHONPATH") from None


def _creator(env_spec: EnvSpec) -> Callable[..., Any] | None:
    entry = env_spec.entry_point
    if callable(entry):
        return entry
    try:
        from gymnasium.envs.registration import load_env_creator

        return load_env_creator(entry) if entry else None
    except Exception:  # only used to word an error; the original TypeError is raised when this fails
        return None


def _accepted_keywords(creator: Callable[..., Any] | None) -> set[str] | None:
    """Keyword names ``creator`` takes, following ``**kwargs`` up a class's bases; None when it takes any."""
    if creator is None:
        return None
    functions = [c.__dict__["__init__"] for c in creator.__mro__ if "__init__" in c.__dict__] \
        if isinstance(creator, type) else [creator]
    names: set[str] = set()
    for fn in functions:
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            return None
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return names
    return None


_SIMPLE = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _keywords_taking(creator: Callable[..., Any] | None, names: set[str], value: Any) -> set[str]:
    """The keywords among ``names`` that could take ``value``: for a plain value (number, string, flag), those
    annotated to allow it, or not annotated; any keyword for other values. A did-you-mean from these does not
    point an integer at a keyword that wants a list of Task objects."""
    if not isinstance(value, int | float | str | bool) or creator is None:
        return names
    functions = [c.__dict__["__init__"] for c in creator.__mro__ if "__init__" in c.__dict__] \
        if isinstance(creator, type) else [creator]
    hints: dict[str, Any] = {}
    for fn in reversed(functions):
        try:
            hints.update(typing.get_type_hints(fn))
        except Exception:  # an annotation that does not evaluate says nothing against the keyword
            continue
    def takes(allowed: Any) -> bool:  # a Literal's choices take any string: a misspelt choice is its own error
        return isinstance(value, str) if isinstance(allowed, tuple) else _fits(value, allowed)

    taking = set()
    for name in names:
        allowed = _allowed(hints[name]) if name in hints else [type(value)]
        if allowed is not None and any(takes(a) for a in allowed):
            taking.add(name)
    return taking


def check_keyword_types(spec: str, creator: Callable[..., Any] | None, kwargs: Mapping[str, Any]) -> None:
    """``ConfigError`` for a keyword whose value cannot be what ``creator`` annotates (int, float, str, bool, a
    Literal, or one of those or None); other annotations are the env's to check."""
    if creator is None:
        return
    functions = [c.__dict__["__init__"] for c in creator.__mro__ if "__init__" in c.__dict__] \
        if isinstance(creator, type) else [creator]
    seen: set[str] = set()
    for fn in functions:
        try:
            params = inspect.signature(fn).parameters
            hints = typing.get_type_hints(fn)
        except Exception:  # an annotation that does not evaluate: leave the values to the env
            continue
        for name, value in kwargs.items():
            if name in seen or name not in params or name not in hints:
                continue
            seen.add(name)
            allowed = _allowed(hints[name])
            if allowed is None or any(_fits(value, a) for a in allowed):
                continue
            default = params[name].default
            example = f" (its default is {default!r})" if default is not inspect.Parameter.empty else ""
            want = " or ".join(_SIMPLE.get(a, repr(a)) if not isinstance(a, tuple) else
                               "one of " + ", ".join(map(repr, a)) for a in allowed)
            raise ConfigError(f"expected {name} of {spec} to be {want}, got {value!r}; fix: pass {name}=<"
                              f"{want}>{example}")


def _allowed(hint: Any) -> list[Any] | None:
    """The simple types (and Literal choices, as a tuple) a hint allows; None when it allows anything else."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [_allowed(a) for a in typing.get_args(hint)]
        return None if any(p is None for p in parts) else [a for p in parts for a in p]  # type: ignore[union-attr]
    if origin is typing.Literal:
        return [tuple(typing.get_args(hint))]
    if hint is type(None):
        return [None]
    return [hint] if hint in _SIMPLE else None


def _fits(value: Any, allowed: Any) -> bool:
    if isinstance(allowed, tuple):
        return value in allowed
    if allowed is None:
        return value is None
    if allowed is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if allowed is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, allowed)


def _unexpected_keyword(exc: TypeError, kwargs: Mapping[str, Any], env_spec: EnvSpec) -> str | None:
    """The user's keyword that ``exc`` complains about, when the env's signature confirms it takes no such
    keyword (a TypeError from deeper inside the constructor is a bug and keeps its traceback)."""
    match = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    if match is None or match.group(1) not in kwargs:
        return None
    accepted = _accepted_keywords(_creator(env_spec))
    return match.group(1) if accepted is not None and match.group(1) not in accepted else None
