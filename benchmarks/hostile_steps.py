"""Step time and observation size for hostile model text, per registered env id: the actions of the attacker
tests (huge integers, deep nesting, as many calls as fit, the longest action) plus, where an env has a tool that
can be made slow, a turn of the slowest calls it allows (infinite loops in the math sandbox, BFCL ``power`` with
a huge exponent). Prints a table and writes benchmarks/results/hostile_steps.json.

    python benchmarks/hostile_steps.py [--quick]      # --quick: the slowest-calls turns on one id per family
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

from tests.environments.test_hostile_text import hostile_actions
from trace_gym.env import TextEnv, ToolEnv
from trace_gym.env_specs import make_env
from trace_gym.registration import trace_env_ids
from trace_gym.tools import ToolCall


def slow_turn(env: TextEnv, info: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """An action of the slowest calls a turn may make, and the reset options it needs; None when the env has no
    tool that can be made slow."""
    names = {t["function"]["name"] for t in info["tools"]}
    if isinstance(env, ToolEnv) and "python" in names:
        call = ToolCall("python", {"code": "while True:\n    pass"})
        return env.parser.format(*[call] * (env.max_tool_calls + 1)), {}
    if hasattr(env, "max_calls_per_step"):
        task = next(t for t in env.tasks if "MathAPI" in t.meta["involved_classes"])
        calls = ["power(base=10, exponent=100000000)"] * (env.max_calls_per_step + 1)
        return "[" + ", ".join(calls) + "]", {"task": task}
    return None


def measure(env: gym.Env, action: str, options: dict[str, Any] | None = None) -> dict[str, float]:
    env.reset(seed=0, options=options)
    start = time.perf_counter()
    obs, *_ = env.step(action)
    return {"step_s": time.perf_counter() - start, "obs_chars": len(obs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "hostile_steps.json")
    args = parser.parse_args()
    rows: dict[str, dict[str, Any]] = {}
    slow_families: set[str] = set()
    print(f"{'env id':36} {'worst hostile case':44} {'step s':>8} {'obs chars':>10} {'slowest turn s':>15}")
    for env_id in trace_env_ids():
        env = make_env(env_id)
        _, info = env.reset(seed=0)
        base = env.unwrapped
        assert isinstance(base, TextEnv)
        function = info["tools"][0]["function"]
        param = next(iter(function["parameters"].get("properties", {})), "x")
        cases = {name: measure(env, action)
                 for name, action in hostile_actions(function["name"], param, base.max_action_chars).items()}
        worst = max(cases, key=lambda name: cases[name]["step_s"])
        row: dict[str, Any] = {"cases": cases, "worst_case": worst, "worst_step_s": cases[worst]["step_s"],
                               "max_obs_chars": max(c["obs_chars"] for c in cases.values())}
        family = type(base).__name__
        slow = slow_turn(base, info)
        if slow is not None and not (args.quick and family in slow_families):
            slow_families.add(family)
            row["slowest_turn"] = measure(env, *slow)
        rows[env_id] = row
        slowest = f"{row['slowest_turn']['step_s']:.2f}" if "slowest_turn" in row else "-"
        print(f"{env_id:36} {worst:44} {row['worst_step_s']:8.3f} {row['max_obs_chars']:10d} {slowest:>15}",
              flush=True)
        env.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"cpus": len(os.sched_getaffinity(0)), "platform": platform.platform(), "load": os.getloadavg()[0]}
    args.out.write_text(json.dumps({"machine": meta, "envs": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
