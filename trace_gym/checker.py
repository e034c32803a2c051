"""The conformance checker every ``trace/*`` env must pass: gymnasium's ``check_env`` plus the snapshot
contract (restore k times -> identical independent branches; replay equals native; portable snapshots restore
into a fresh instance; snapshots are immutable; no process outlives ``close``)."""

from __future__ import annotations

import gc
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import check_env

from trace_gym.env import TextEnv
from trace_gym.errors import TraceGymError

Outcome = tuple[str, float, bool, bool, list[dict[str, Any]]]


class ConformanceError(TraceGymError, AssertionError):
    """The env breaks the trace_gym env contract; the message names the first violation."""


def descendant_pids(pid: int | None = None) -> set[int]:
    """Descendants of ``pid`` (default: this process), read from /proc. Zombies count: an unreaped child still
    holds a pid and a slot of its user's process limit."""
    root = os.getpid() if pid is None else pid
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def _make_factory(env: str | Callable[[], gym.Env[str, str]]) -> Callable[[], TextEnv]:
    def factory() -> TextEnv:
        made = gym.make(env) if isinstance(env, str) else env()
        base = made.unwrapped
        if not isinstance(base, TextEnv):
            raise ConformanceError(f"expected a trace_gym TextEnv, got {type(base).__name__}")
        return base

    return factory


def play_outcomes(env: TextEnv, actions: Sequence[str]) -> list[Outcome]:
    """Step ``actions`` until the episode ends; each step's (observation, reward, terminated, truncated,
    messages) is what the snapshot contract compares."""
    out = []
    for action in actions:
        if env._done:
            break
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs, reward, terminated, truncated, info["messages"]))
    return out


def _script(env: TextEnv, rng: np.random.Generator, n: int) -> list[str]:
    """Well-formed actions of the env mixed with random strings, so both tool state and errors are exercised."""
    examples = env.example_actions()
    actions = []
    for _ in range(n):
        if examples and rng.random() < 0.75:
            actions.append(examples[int(rng.integers(len(examples)))])
        else:
            actions.append(env.action_space.sample())
    return actions


def check_trace_env(env: str | Callable[[], gym.Env[str, str]], seed: int = 0, depth: int = 3,
                    branches: int = 3, scripts: int = 3, skip_gym_check: bool = False) -> None:
    """Raise ``ConformanceError`` at the first violation. ``env`` is a registered id or a zero-argument factory.

    The snapshot contract is checked on ``scripts`` random action scripts, each snapshotting after a prefix of
    ``depth`` non-final turns and comparing ``depth + 2`` further turns across restores.
    """
    factory = _make_factory(env)
    # A throwaway episode first: process-wide helpers an env starts once (a sandbox's template process) are
    # then part of the baseline, and only processes that outlive their episode count as leaks.
    warmup = factory()
    warmup.reset(seed=seed)
    play_outcomes(warmup, warmup.example_actions()[:1])
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
        _check_script(base, other, rng, seed + script, depth, branches)
    other.close()
    base.close()
    del other, base
    gc.collect()
    leaked = descendant_pids() - before
    if leaked:
        raise ConformanceError(f"expected no processes left after close(), found pids {sorted(leaked)}")


def _check_script(base: TextEnv, other: TextEnv, rng: np.random.Generator, seed: int, depth: int,
                  branches: int) -> None:
    for _ in range(20):  # find a prefix that leaves the episode running, so the future has state to diverge on
        base.reset(seed=seed)
        prefix = _script(base, rng, depth)
        if len(play_outcomes(base, prefix)) == len(prefix) and not base._done:
            break
    native, replay = base.snapshot("native"), base.snapshot("replay")
    future = _script(base, rng, depth + 2)
    reference = play_outcomes(base, future)
    for i in range(branches):
        base.restore(native)
        _expect_same(reference, play_outcomes(base, future), f"native restore #{i + 1}")
    # A branch that diverges must not change the snapshot it came from.
    base.restore(native)
    play_outcomes(base, [base.action_space.sample() for _ in range(2)])
    base.restore(replay)
    _expect_same(reference, play_outcomes(base, future), "replay restore")
    other.reset(seed=seed + 1)
    other.restore(replay)
    _expect_same(reference, play_outcomes(other, future), "replay restore into a new instance")
    base.restore(native)
    _expect_same(reference, play_outcomes(base, future), "native restore after other branches")
    native.release()
    replay.release()


def _expect_same(reference: list[Outcome], got: list[Outcome], what: str) -> None:
    for step, (want, have) in enumerate(zip(reference, got)):
        if want != have:
            names = ("observation", "reward", "terminated", "truncated", "messages")
            field = next(n for n, a, b in zip(names, want, have) if a != b)
            raise ConformanceError(f"{what}: step {step} differs in {field}: expected {want[names.index(field)]!r}"
                                   f", got {have[names.index(field)]!r}")
    if len(reference) != len(got):
        raise ConformanceError(f"{what}: expected {len(reference)} steps before the episode ended, got {len(got)}")
