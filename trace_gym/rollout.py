"""``trace-gym envs`` and ``trace-gym rollout``: scripted-expert tree rollouts saved as JSONL.

Each episode is one tree: a full expert trajectory, then ``branches`` continuations from random visited
non-terminal turns, each played to the end. With a noisy expert the trees have mixed outcomes, which is what
allocation and tree advantages feed on.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from trace_gym.env_specs import make_env
from trace_gym.errors import ConfigError
from trace_gym.experts import Expert
from trace_gym.registration import ENV_SPECS, trace_env_ids
from trace_gym.tree import RolloutTree
from trace_gym.wrappers import TreeRolloutWrapper


def play_to_end(env: TreeRolloutWrapper, expert: Expert, messages: list[dict[str, Any]]) -> None:
    """Step ``expert`` until the episode ends, starting from the env's current node."""
    task = env.base.task
    assert task is not None
    while True:
        _, _, terminated, truncated, info = env.step(expert.act(task, messages))
        if terminated or truncated:
            return
        messages = info["messages"]


def expert_tree(env: TreeRolloutWrapper, expert: Expert, rng: np.random.Generator, branches: int,
                seed: int | None = None, options: dict[str, Any] | None = None) -> RolloutTree:
    """One bare expert rollout plus ``branches`` continuations from uniformly chosen visited prefixes."""
    _, info = env.reset(seed=seed, options=options)
    play_to_end(env, expert, info["messages"])
    for _ in range(branches):
        assert env.tree is not None
        open_nodes = [n.id for n in env.tree if not n.is_terminal]
        _, info = env.branch(open_nodes[int(rng.integers(len(open_nodes)))])
        play_to_end(env, expert, info["messages"])
    assert env.tree is not None
    return env.tree


def envs_table() -> Table:
    """The ``trace-gym envs`` table: every trace id in full (ids never wrap or shorten, even at 80 columns),
    its tools, and the class and settings it is made with."""
    ids = trace_env_ids()
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True,
                  caption="gym.make(ID, **kwargs); your own env: module:Class or module:id")
    table.add_column("id", no_wrap=True, min_width=max(map(len, ids)))
    table.add_column("tools")
    table.add_column("class and settings", overflow="fold")
    for env_id in ids:
        entry, kwargs = ENV_SPECS[env_id]
        env = gym.make(env_id).unwrapped
        tools = ", ".join(t.name for t in getattr(env, "tool_map", {}).values()) or "per task"
        made = "\n".join([entry.rsplit(":", 1)[1], *(f"{k}={v}" for k, v in kwargs.items())])
        table.add_row(env_id, tools, made)
        env.close()
    return table


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """Add the options of ``command`` ("envs" has none, "rollout") to ``parser``."""
    if command == "rollout":
        parser.add_argument("--env", required=True,
                            help="env spec: a registered id (trace/HotpotQA-v0), module:id or module:Class")
        parser.add_argument("--policy", default="expert", choices=["expert"], help="the scripted expert of the env")
        parser.add_argument("--noise", type=float, default=0.3, help="expert noise: chance of a wrong step")
        parser.add_argument("--episodes", type=int, default=20, help="trees to roll out")
        parser.add_argument("--branches", type=int, default=3, help="continuations per tree")
        parser.add_argument("--seed", type=int, default=0, help="seed of the expert's noise and the branch points")
        parser.add_argument("--out", type=Path, required=True, help="JSONL file, one tree per line")


def run(command: str, args: argparse.Namespace) -> int:
    """Run ``command``; returns the exit status."""
    console = Console()
    if command == "envs":
        console.print(envs_table())
        return 0
    return _rollout(args, console)


def _rollout(args: argparse.Namespace, console: Console) -> int:
    if args.episodes < 1 or args.branches < 0:
        raise ConfigError(f"expected --episodes >= 1 and --branches >= 0, got {args.episodes}, {args.branches}; "
                          "fix: e.g. --episodes 20 --branches 3")
    env = TreeRolloutWrapper(make_env(args.env))
    expert_fn = getattr(env.base, "expert", None)
    if expert_fn is None:
        raise ConfigError(f"expected an env with a scripted expert (env.expert(noise, seed)), got {args.env} "
                          "without one; fix: give the env an expert(), or roll out a model (trace_gym.agents.specs)")
    expert = expert_fn(noise=args.noise, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    successes, mixed, turns, leaves = 0.0, 0, 0, 0
    columns = (TextColumn("rollout"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with args.out.open("w") as f, Progress(*columns, console=console) as progress:
        for episode in progress.track(range(args.episodes), description="trees"):
            tree = expert_tree(env, expert, rng, args.branches, seed=args.seed + episode)
            f.write(tree.to_json() + "\n")
            tree_leaves = tree.leaves()
            successes += sum(leaf.reward for leaf in tree_leaves)
            leaves += len(tree_leaves)
            turns += sum(leaf.depth for leaf in tree_leaves)
            mixed += tree.is_mixed()
    env.close()
    elapsed = time.perf_counter() - start
    table = Table("rollout", "", box=box.SIMPLE_HEAD, show_edge=False)
    for name, value in (("env", args.env), ("trees", str(args.episodes)), ("trajectories", str(leaves)),
                        ("success rate", f"{successes / leaves:.3f}"), ("mixed trees", f"{mixed}/{args.episodes}"),
                        ("mean turns", f"{turns / leaves:.2f}"), ("seconds", f"{elapsed:.1f}")):
        table.add_row(name, value)
    console.print(table)
    console.print(f"trees written to {args.out}")
    return 0
