"""Restore cost of native vs replay snapshots against episode depth (1..16 turns), on real envs.

Native restore copies the episode state; replay restore re-begins the task and re-plays every action, so it
grows with depth (and with tool cost per turn). Prints a table and writes benchmarks/results/snapshot.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from trace_gym.env_specs import make_env

RESULTS = Path(__file__).parent / "results"


def restore_seconds(env, snap, repeats: int) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            env.restore(snap)
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def measure(env_id: str, depths: list[int], repeats: int) -> list[dict]:
    env = make_env(env_id, max_turns=max(depths) + 1).unwrapped
    rows = []
    for depth in depths:
        env.reset(seed=0)
        for _ in range(depth):
            env.step(env.example_actions()[0])  # a real tool call each turn
        native, replay = env.snapshot("native"), env.snapshot("replay")
        t_native = restore_seconds(env, native, repeats)
        t_replay = restore_seconds(env, replay, repeats)
        rows.append({"env": env_id, "depth": depth, "native_ms": t_native * 1e3, "replay_ms": t_replay * 1e3,
                     "replay_over_native": t_replay / t_native})
        native.release()
        replay.release()
    env.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer depths and repeats")
    parser.add_argument("--envs", nargs="+", default=["trace/HotpotQA-v0"])
    args = parser.parse_args()
    depths = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16]
    repeats = 5 if args.quick else 20
    rows = [row for env_id in args.envs for row in measure(env_id, depths, repeats)]
    table = Table("env", "depth", "native restore ms", "replay restore ms", "replay / native")
    for r in rows:
        table.add_row(r["env"], str(r["depth"]), f"{r['native_ms']:.3f}", f"{r['replay_ms']:.3f}",
                      f"{r['replay_over_native']:.1f}x")
    Console(width=120).print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "snapshot.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
