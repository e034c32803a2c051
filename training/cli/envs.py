"""``trace-gym envs``: the registered trace ids, their tools and how each is made."""

from __future__ import annotations

import argparse

from rich import box
from rich.console import Console
from rich.table import Table

from trace_gym.env_specs import make_env
from trace_gym.errors import SetupError
from trace_gym.registration import ENV_SPECS, trace_env_ids


def envs_table() -> Table:
    """The ``trace-gym envs`` table: every trace id in full (ids never wrap or shorten, even at 80 columns),
    its tools, and the class and settings it is made with. An env this machine cannot make (an optional package
    missing, e.g. bfcl-eval for the BFCL envs) is listed all the same, "needs [k]" in place of its tools and
    note k under the table saying what to install."""
    ids = trace_env_ids()
    fixes: dict[str, int] = {}
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    table.add_column("id", no_wrap=True, min_width=max(map(len, ids)))
    table.add_column("tools")
    table.add_column("class and settings", overflow="fold")
    for env_id in ids:
        entry, kwargs = ENV_SPECS[env_id]
        made = "\n".join([entry.rsplit(":", 1)[1], *(f"{k}={v}" for k, v in kwargs.items())])
        try:
            env = make_env(env_id).unwrapped
        except SetupError as exc:
            note = fixes.setdefault(str(exc).partition("fix: ")[2] or str(exc), len(fixes) + 1)
            table.add_row(env_id, f"needs [{note}]", made)
            continue
        tools = ", ".join(t.name for t in getattr(env, "tool_map", {}).values()) or "per task"
        table.add_row(env_id, tools, made)
        env.close()
    table.caption = "\n".join(["gym.make(ID, **kwargs); your own env: module:Class or module:id",
                                *(f"[{k}] not installed here: {fix}" for fix, k in fixes.items())])
    return table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``envs`` has no options."""


def run(args: argparse.Namespace) -> int:
    """Print the table; returns the exit status."""
    Console().print(envs_table())
    return 0
