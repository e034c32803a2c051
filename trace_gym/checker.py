"""The conformance checker every ``trace/*`` env must pass: gymnasium's ``check_env`` plus the snapshot
contract (restore k times -> identical independent branches; replay equals native; portable snapshots restore
into a fresh instance; snapshots are immutable; no process outlives ``close``).

The actions it plays need nothing from the env author: for a ``ToolEnv`` it writes valid calls of every declared
tool from the tool's JSON schema (string arguments drawn from the words of the episode so far, so that names of
items, files or entities the task mentions come up), formatted by the env's own parser; it adds the env's
``example_actions()`` when there are any, and random strings for the error paths. When the env has a scripted
expert (``env.expert(noise, seed)``), half of the turns are the expert's: its calls carry the arguments that
reach state a generated argument rarely hits (the right key, the code that unlocks). Outcomes compare the
observation, reward, flags, messages and every other ``info`` key; a mismatch names the first differing field
(``messages[3]['content']``) with both values trimmed around the first difference.
"""

from __future__ import annotations

import gc
import re
import string
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import check_env

from trace_gym.env import _BASE_FIELDS, TextEnv, ToolEnv, fingerprint
from trace_gym.env_specs import make_env
from trace_gym.errors import ConfigError, SnapshotError, TraceGymError
from trace_gym.processes import descendant_pids, services
from trace_gym.seeds import derive
from trace_gym.tools import ToolCall

Outcome = tuple[str, float, bool, bool, list[dict[str, Any]], dict[str, Any]]


class ConformanceError(TraceGymError, AssertionError):
    """The env breaks the trace_gym env contract; the message names the first violation."""


@dataclass(frozen=True)
class ConformanceReport:
    """What `check_trace_env` checked on an env that passed; ``str(report)`` is the line it prints."""

    env: str
    gym_check: bool
    """Whether gymnasium's ``check_env`` ran (``skip_gym_check=False``)."""
    scripts: int
    branches: int
    depth: int
    tools: tuple[str, ...]
    """The declared tools whose calls were played (none for a ``TextEnv`` without tools)."""
    expert: bool
    """Whether half of the turns were the env's scripted expert's."""

    def __str__(self) -> str:
        checks = ["gymnasium check_env" if self.gym_check else "gymnasium check_env skipped",
                  f"{self.scripts} scripts of {self.depth} turns, each restored {self.branches} times natively, "
                  "from a replay and into a fresh instance, identically",
                  f"calls of {', '.join(self.tools)}" if self.tools else "no declared tools",
                  "expert turns" if self.expert else "no expert: schema-generated calls only, so state that only a "
                  "right argument reaches (a key, a code) went unchecked",
                  "no process left after close"]
        return f"{self.env} conforms: " + "; ".join(checks)


def _make_factory(env: str | Callable[[], gym.Env[str, str]]) -> Callable[[], TextEnv]:
    if isinstance(env, gym.Env):  # gymnasium's check_env takes one; this checker builds fresh instances
        name = type(env.unwrapped).__name__
        raise ConfigError(f"expected a registered id or a zero-argument factory, got a {name} instance (the checker "
                          f"builds fresh envs to compare across restores); fix: check_trace_env('my/Env-v0') or "
                          f"check_trace_env(lambda: {name}(...))")

    def factory() -> TextEnv:
        made = make_env(env) if isinstance(env, str) else env()
        base = made.unwrapped
        if not isinstance(base, TextEnv):
            raise ConformanceError(f"expected a trace_gym TextEnv, got {type(base).__name__}")
        return base

    return factory


def play_outcomes(env: TextEnv, actions: Sequence[str], ignore_info: Collection[str] = ()) -> list[Outcome]:
    """Step ``actions`` until the episode ends; each step's (observation, reward, terminated, truncated,
    messages, other info keys but ``ignore_info``) is what the snapshot contract compares."""
    out = []
    for action in actions:
        if env.done:
            break
        obs, reward, terminated, truncated, info = env.step(action)
        rest = {k: v for k, v in info.items() if k != "messages" and k not in ignore_info}
        out.append((obs, reward, terminated, truncated, info["messages"], rest))
    return out


_WORD = re.compile(r"[^\W_][\w\-.']*")


def sample_value(schema: Any, rng: np.random.Generator, words: Sequence[str] = (), depth: int = 0) -> Any:
    """A value valid under the JSON schema ``schema`` (the keywords tool schemas use: type, enum, const,
    anyOf/oneOf, bounds, items, properties/required); strings come from ``words`` when there are any."""
    if not isinstance(schema, Mapping):
        return _sample_string({}, rng, words)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return sample_value(schema[key][int(rng.integers(len(schema[key])))], rng, words, depth)
    if schema.get("allOf"):
        return sample_value({k: v for part in schema["allOf"] if isinstance(part, Mapping) for k, v in part.items()},
                            rng, words, depth)
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"] or kind
        kind = kinds[int(rng.integers(len(kinds)))]
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "integer":
        low = schema.get("minimum", schema.get("exclusiveMinimum", -1) + 1)
        high = schema.get("maximum", schema.get("exclusiveMaximum", low + 11) - 1)
        return int(rng.integers(int(low), int(max(low, high)) + 1))
    if kind == "number":
        low = float(schema.get("minimum", schema.get("exclusiveMinimum", 0.0)))
        high = float(schema.get("maximum", schema.get("exclusiveMaximum", low + 10.0)))
        value = round(float(rng.uniform(low, high)), 2)
        if value in (schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")) or not low <= value <= high:
            value = (low + high) / 2  # rounding landed on an excluded bound
        return value
    if kind == "boolean":
        return bool(rng.random() < 0.5)
    if kind == "null":
        return None
    if kind == "array":
        low = int(schema.get("minItems", 1))
        high = max(low, int(schema.get("maxItems", low + 2)))
        n = int(rng.integers(low, high + 1)) if depth < 3 else low
        return [sample_value(schema.get("items", {}), rng, words, depth + 1) for _ in range(n)]
    if kind == "object":
        props = schema.get("properties", {}) if depth < 3 else {}
        required = set(schema.get("required", []))
        return {name: sample_value(sub, rng, words, depth + 1) for name, sub in props.items()
                if name in required or rng.random() < 0.5}
    return _sample_string(schema, rng, words)


def _sample_string(schema: Mapping[str, Any], rng: np.random.Generator, words: Sequence[str]) -> str:
    if words and rng.random() < 0.8:
        text = words[int(rng.integers(len(words)))]
    else:
        letters = string.ascii_lowercase + string.digits
        text = "".join(letters[int(i)] for i in rng.integers(len(letters), size=int(rng.integers(1, 9))))
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    text = text.ljust(low, "x")
    return text[: int(high)] if high is not None else text


def schema_calls(env: TextEnv, rng: np.random.Generator, n: int) -> list[str]:
    """``n`` turns that each call one declared tool with arguments valid under its schema, written in the env's
    action format; empty for envs without declared tools or a parser that cannot write calls."""
    if not isinstance(env, ToolEnv) or not env.tool_map:
        return []
    text = " ".join(str(m.get("content", "")) for m in env.messages if m.get("role") != "system")
    words = _WORD.findall(text)  # with repeats: a word the task mentions often is drawn often
    tools = list(env.tool_map.values())
    out: list[str] = []
    for _ in range(n * 4):
        if len(out) == n:
            break
        tool = tools[int(rng.integers(len(tools)))]
        call = ToolCall(tool.name, sample_value(tool.parameters, rng, words))
        try:
            out.append(env.parser.format(call))
        except (ConfigError, AttributeError):
            continue  # a call the format cannot write (several arguments in the tag format)
    return out


def expert_of(env: TextEnv, seed: int) -> Any:
    """The env's scripted expert (noise 0) when it has one, else None."""
    make = getattr(env, "expert", None)
    if not callable(make):
        return None
    try:
        return make(noise=0.0, seed=seed)
    except NotImplementedError:
        return None


def next_action(env: TextEnv, rng: np.random.Generator, expert: Any, allow_answer: bool = True) -> str:
    """One turn: the expert's next action half of the time (when there is an expert, and when it is not a final
    answer unless ``allow_answer``), else one of `_script`'s."""
    if expert is not None and env.task is not None and rng.random() < 0.5:
        action = expert.act(env.task, list(env.messages))
        parser = getattr(env, "parser", None)
        is_answer = parser is not None and parser.parse(action, getattr(env, "tool_map", {})).answer is not None
        if allow_answer or not is_answer:
            return action
    return _script(env, rng, 1)[0]


def _script(env: TextEnv, rng: np.random.Generator, n: int) -> list[str]:
    """Schema-valid tool calls, the env's example actions and random strings, so that tool state and error
    paths are both exercised."""
    examples = env.example_actions()
    calls = schema_calls(env, rng, n)
    actions = []
    for i in range(n):
        u = rng.random()
        if calls and (u < 0.6 or (not examples and u < 0.8)):
            actions.append(calls[i])
        elif examples and u < 0.9:
            actions.append(examples[int(rng.integers(len(examples)))])
        else:
            actions.append(env.action_space.sample())
    return actions


def check_trace_env(env: str | Callable[[], gym.Env[str, str]], seed: int = 0, depth: int = 3,
                    branches: int = 3, scripts: int = 3, skip_gym_check: bool = False,
                    ignore_info: Collection[str] = (), quiet: bool = False) -> ConformanceReport:
    """Raise ``ConformanceError`` at the first violation; on success print what was checked (one line, unless
    ``quiet``) and return it as a `ConformanceReport`. ``env`` is a registered id or a zero-argument factory.

    The snapshot contract is checked on ``scripts`` random action scripts, each snapshotting after a prefix of
    ``depth`` non-final turns and comparing ``depth + 2`` further turns across restores. ``ignore_info`` names
    ``info`` keys that may legitimately differ between identical branches (wall-clock timings).
    """
    factory = _make_factory(env)
    # A throwaway episode first, so that most process-wide helpers are started before the baseline; helpers
    # registered later (trace_gym.processes) are not leaks either: only what outlives its episode is.
    warmup = factory()
    warmup.reset(seed=seed)
    play_outcomes(warmup, (schema_calls(warmup, np.random.default_rng(seed), 1) or warmup.example_actions())[:1])
    warmup.close()
    del warmup
    gc.collect()
    before = descendant_pids()
    base = factory()
    if not skip_gym_check:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # gymnasium warns about non-numpy spaces; the checks still run
            check_env(base, skip_render_check=True)
    rng = np.random.default_rng(seed)
    other = factory()
    for script in range(scripts):
        _check_script(base, other, rng, derive(seed, script), depth, branches, frozenset(ignore_info))
    report = ConformanceReport(env if isinstance(env, str) else type(base).__name__, not skip_gym_check, scripts,
                               branches, depth, tuple(getattr(base, "tool_map", {})), expert_of(base, seed) is not None)
    other.close()
    base.close()
    del other, base
    gc.collect()
    leaked = descendant_pids() - before - services()
    if leaked:
        raise ConformanceError(f"expected no processes left after close(), found pids {sorted(leaked)}")
    if not quiet:
        print(report)
    return report


def _check_script(base: TextEnv, other: TextEnv, rng: np.random.Generator, seed: int, depth: int,
                  branches: int, ignore: frozenset[str]) -> None:
    # Find a prefix that leaves the episode running and changed the env's state, so that a restore has state to
    # get wrong; failing that, one that leaves it running. Envs holding containers (a stock, a file table) get
    # more tries: the strings that hit their keys are drawn by chance.
    running, patience = None, 20 if _holds_containers(base) else 1
    expert = expert_of(base, seed)
    for attempt in range(20):
        base.reset(seed=seed)
        start = _public_state(base)
        played = 0
        for _turn in range(depth):  # one action at a time: calls draw their strings from what came back so far
            played += len(play_outcomes(base, [next_action(base, rng, expert, allow_answer=False)]))
        if played == depth and not base.done:
            running = base.snapshot("replay")
            if _public_state(base) != start or attempt >= patience - 1:
                break
    else:
        if running is not None:
            base.restore(running)
    try:
        native = base.snapshot("native")
    except SnapshotError as e:
        raise ConformanceError(f"native snapshot after {depth} turns: {e}") from e
    replay = base.snapshot("replay")
    future: list[str] = []
    reference: list[Outcome] = []
    for _turn in range(depth + 2):  # chosen as they go (the expert reads each observation), then replayed as is
        if base.done:
            break
        future.append(next_action(base, rng, expert))
        reference += play_outcomes(base, future[-1:], ignore)
    for i in range(branches):
        base.restore(native)
        _expect_same(reference, play_outcomes(base, future, ignore), f"native restore #{i + 1}")
    # A branch that diverges must not change the snapshot it came from.
    base.restore(native)
    play_outcomes(base, _script(base, rng, 2))
    base.restore(replay)
    _expect_same(reference, play_outcomes(base, future, ignore), "replay restore")
    other.reset(seed=seed + 1)
    other.restore(replay)
    _expect_same(reference, play_outcomes(other, future, ignore), "replay restore into a new instance")
    base.restore(native)
    _expect_same(reference, play_outcomes(base, future, ignore), "native restore after other branches")
    native.release()
    replay.release()


def _holds_containers(env: TextEnv) -> bool:
    return any(isinstance(v, list | dict | set) for k, v in vars(env).items()
               if not k.startswith("_") and k not in _BASE_FIELDS)


def _public_state(env: TextEnv) -> Any:
    return fingerprint({k: v for k, v in vars(env).items() if not k.startswith("_") and k not in _BASE_FIELDS})


def _expect_same(reference: list[Outcome], got: list[Outcome], what: str) -> None:
    for step, (want, have) in enumerate(zip(reference, got)):
        if want != have:
            names = ("observation", "reward", "terminated", "truncated", "messages", "info")
            field = next(n for n, a, b in zip(names, want, have) if a != b)
            i = names.index(field)
            where, a, b = first_difference(want[i], have[i], field)
            raise ConformanceError(f"{what}: step {step} differs at {where}: expected {a}, got {b}")
    if len(reference) != len(got):
        raise ConformanceError(f"{what}: expected {len(reference)} steps before the episode ended, got {len(got)}")


def first_difference(want: Any, have: Any, where: str, width: int = 60) -> tuple[str, str, str]:
    """(path, want, have) at the first place two values differ: ``messages[3]['content']`` and the two values'
    reprs, each at most about ``2 * width`` characters (strings are cut around their first differing
    character)."""
    if isinstance(want, Mapping) and isinstance(have, Mapping):
        for key in [*want, *(k for k in have if k not in want)]:
            if key not in want or key not in have:
                return (f"{where}[{key!r}]", _short(want.get(key, "<missing>"), width),
                        _short(have.get(key, "<missing>"), width))
            if want[key] != have[key]:
                return first_difference(want[key], have[key], f"{where}[{key!r}]", width)
    if isinstance(want, list | tuple) and isinstance(have, list | tuple):
        for k, (a, b) in enumerate(zip(want, have)):
            if a != b:
                return first_difference(a, b, f"{where}[{k}]", width)
        if len(want) != len(have):
            return f"len({where})", str(len(want)), str(len(have))
    if isinstance(want, str) and isinstance(have, str):
        at = next((k for k, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
        start = max(at - width // 2, 0)
        return f"{where} (character {at})", _window(want, start, width), _window(have, start, width)
    return where, _short(want, width), _short(have, width)


def _window(text: str, start: int, width: int) -> str:
    return ("..." if start else "") + repr(text[start:start + width]) + ("..." if len(text) > start + width else "")


def _short(value: Any, width: int) -> str:
    text = repr(value)
    return text if len(text) <= 2 * width else text[:2 * width] + f"... ({len(text)} characters)"
