"""BFCL env throughput and snapshot cost: env steps/s (ground-truth playback) and, on long-context entries,
native (deep-copy) snapshot + restore vs replay restore, at the last user turn of each entry.

    python benchmarks/bfcl.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from trace_gym.environments.bfcl.env import BFCLMultiTurnEnv
from trace_gym.environments.bfcl.expert import BFCLExpert


def play_to(env: BFCLMultiTurnEnv, task, expert: BFCLExpert, stop_turn: int | None = None) -> int:
    """Play the ground truth; stop before user turn `stop_turn` ends (None: to the end). Returns steps."""
    _, info = env.reset(options={"task": task})
    steps = 0
    while True:
        if stop_turn is not None and env.turn_index >= stop_turn:
            return steps
        _, _, terminated, truncated, info = env.step(expert.act(task, info["messages"]))
        steps += 1
        if terminated or truncated:
            return steps


def throughput(category: str, n_tasks: int) -> dict[str, float]:
    env = BFCLMultiTurnEnv(category, split="all")
    expert = BFCLExpert()
    tasks = env.tasks[:n_tasks]
    start = time.perf_counter()
    steps = sum(play_to(env, task, expert) for task in tasks)
    elapsed = time.perf_counter() - start
    return {"episodes": len(tasks), "steps": steps, "steps_per_s": steps / elapsed,
            "episodes_per_s": len(tasks) / elapsed}


def snapshot_cost(n_tasks: int, repeats: int) -> dict[str, float]:
    env = BFCLMultiTurnEnv("multi_turn_long_context", split="all")
    expert = BFCLExpert()
    take, native, replay, depths = [], [], [], []
    for task in env.tasks[:n_tasks]:
        depth = play_to(env, task, expert, stop_turn=len(task.answer) - 1)
        depths.append(depth)
        t0 = time.perf_counter()
        snap_native = env.snapshot("native")
        take.append(time.perf_counter() - t0)
        snap_replay = env.snapshot("replay")
        probe = expert.act(task, env.messages)  # the last turn's ground-truth calls
        reference = env.step(probe)[0]
        for _ in range(repeats):
            t0 = time.perf_counter()
            env.restore(snap_native)
            native.append(time.perf_counter() - t0)
            assert env.step(probe)[0] == reference
            t0 = time.perf_counter()
            env.restore(snap_replay)
            replay.append(time.perf_counter() - t0)
            assert env.step(probe)[0] == reference
    return {"entries": n_tasks, "mean_depth_steps": statistics.mean(depths),
            "native_take_ms": 1e3 * statistics.median(take), "native_restore_ms": 1e3 * statistics.median(native),
            "replay_restore_ms": 1e3 * statistics.median(replay),
            "replay_over_native": statistics.median(replay) / statistics.median(native)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer entries and repeats")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bfcl.json")
    args = parser.parse_args()
    n, repeats = (10, 3) if args.quick else (200, 10)
    results = {"quick": args.quick,
               "throughput": {c: throughput(c, n) for c in ("multi_turn_base", "multi_turn_long_context")},
               "snapshot_long_context": snapshot_cost(min(n, 50), repeats)}
    print(f"{'category':<26}{'episodes':>9}{'steps':>8}{'steps/s':>10}{'episodes/s':>12}")
    for c, r in results["throughput"].items():
        print(f"{c:<26}{r['episodes']:>9}{r['steps']:>8}{r['steps_per_s']:>10.0f}{r['episodes_per_s']:>12.1f}")
    s = results["snapshot_long_context"]
    print(f"\nlong-context snapshot at the last user turn ({s['entries']} entries, "
          f"mean depth {s['mean_depth_steps']:.1f} steps)")
    print(f"{'native take ms':>16}{'native restore ms':>19}{'replay restore ms':>19}{'replay/native':>15}")
    print(f"{s['native_take_ms']:>16.2f}{s['native_restore_ms']:>19.2f}{s['replay_restore_ms']:>19.2f}"
          f"{s['replay_over_native']:>15.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
