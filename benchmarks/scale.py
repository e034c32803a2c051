"""The env side at scale: one step of K trajectories through the collector, per snapshot policy, K = 64 ... 1,024.

For each env (Arithmetic with the jailed Python sandbox: three cells per episode, then the answer; HotpotQA with
BM25: the scripted expert) and each allocator's snapshot policy (``grpo``: flat, no native snapshot; ``treepo``:
branching, K/2 bare rollouts and K/2 continuations; on Arithmetic up to K = 256 also ``every node``, the
collector's earlier policy of a frozen fork at every open node kept until the next step), one `take_step` of
K trajectories (groups of 16, N = 1) measures: peak sandbox processes and their PSS, peak host descriptors,
each env step's latency as the collector sees it (restore + step + snapshot; median and p99), the wall time of
the step, and then per episode the time of `reset()` and of `close()` and the time until the reaper has seen
every ended lineage gone. Prints a table and writes benchmarks/results/scale.json; a limit that stops a run
(descriptors, processes, memory) is recorded with the K it stopped at.

    python benchmarks/scale.py [--quick] [--minutes M]   # --quick: K = 16 and 32
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from _common import machine, write_json

import trace_gym  # noqa: F401  (registers the ids)
from trace_gym.agents.policy import Generation, Request, SamplingParams
from trace_gym.agents.scripted import ExpertPolicy
from trace_gym.env_specs import EnvFactory, env_factory
from trace_gym.environments.math.env import ArithmeticEnv
from trace_gym.environments.sandbox import reaper
from trace_gym.environments.sandbox.host import sandbox_processes, start_template
from trace_gym.training.allocation.allocators import make_allocator
from trace_gym.training.allocation.predictor import FeaturePredictor
from trace_gym.training.config import StepBudget
from trace_gym.training.rollout.collector import SnapshotPolicy, TreeCollector
from trace_gym.training.step import take_step
from trace_gym.wrappers import TreeRolloutWrapper

CELLS = 3
GROUP = 16
MEMORY_CAP = 12 << 30  # bytes of PSS + host RSS this benchmark allows itself on the shared 24 GiB machine


class Cells:
    """Arithmetic episodes of CELLS cells (each keeps a value in the interpreter), then an answer."""

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Generation]:
        out = []
        for r in requests:
            turn = sum(m["role"] == "assistant" for m in r.messages or [])
            text = f"<python>x{turn} = {turn} * 7\nprint(x{turn})</python>" if turn < CELLS else "<answer>0</answer>"
            out.append(Generation(text, [], [], "stop", 0))
        return out


class Sampled:
    """Wraps a policy: before every turn (one generate call over all active branches) it samples the host."""

    def __init__(self, inner: Any):
        self.inner, self.samples, self.spent = inner, [], 0.0

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Generation]:
        t0 = time.perf_counter()
        self.samples.append(sample_host())
        self.spent += time.perf_counter() - t0
        return self.inner.generate(requests, sampling)


class Timed(TreeCollector):
    """`TreeCollector` recording each env step as the collector plays it (restore, step, snapshot)."""

    latencies: list[float]

    def _step(self, b: Any, g: Generation, stats: Any) -> None:
        t0 = time.perf_counter()
        super()._step(b, g, stats)
        self.latencies.append(time.perf_counter() - t0)


class EveryNode(Timed):
    """The earlier policy, for reference: a frozen fork at every open node, none released within the step."""

    def _wrapper(self) -> TreeRolloutWrapper:
        return self._pool.pop() if self._pool else TreeRolloutWrapper(self.make_env(), self.snapshot_kind)

    def _release_natives(self, keep: set[tuple[str, int]]) -> None:
        pass


def sample_host() -> dict[str, float]:
    """Sandbox processes (after the reaper's pending ends), their summed PSS, and this process's descriptors."""
    pids = sandbox_processes()
    pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                pss += next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024
        except (OSError, StopIteration, ValueError):
            continue
    return {"processes": len(pids), "pss": pss, "fds": len(os.listdir("/proc/self/fd"))}


def pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def run(env_name: str, make_env: Callable[[], gym.Env], policy: Any, tasks: list, label: str, k: int) -> dict:
    allocator = make_allocator("treepo" if label != "grpo" else "grpo", group_size=GROUP)
    budget = StepBudget(k // 2, 1)
    sampled = Sampled(policy)
    kind = EveryNode if label == "every node" else Timed
    # "every node": its wrappers take a native snapshot at every node themselves, so no policy adds any.
    snapshots = (SnapshotPolicy(branching=False) if kind is EveryNode
                 else SnapshotPolicy.for_allocator(allocator, budget))
    collector = kind(sampled, make_env, tasks, SamplingParams(), workers=2, snapshots=snapshots)
    collector.latencies = []
    row: dict[str, Any] = {"env": env_name, "policy": label, "K": k}
    try:
        t0 = time.perf_counter()
        result = take_step(collector, allocator, FeaturePredictor(dim=512), tasks[: 2 * k // GROUP + 1], budget,
                           seed=0, step=0)
        wall = time.perf_counter() - t0 - sampled.spent
        after = sample_host()
        samples = [*sampled.samples, after]
        peak = max(samples, key=lambda s: s["processes"])
        row.update(trajectories=result.stats.trajectories, step_wall_s=wall,
                   processes=peak["processes"], pss_mb=max(s["pss"] for s in samples) / 2**20,
                   fds=max(s["fds"] for s in samples), processes_after=after["processes"],
                   step_median_ms=1e3 * statistics.median(collector.latencies),
                   step_p99_ms=1e3 * pct(collector.latencies, 0.99))
        collector.begin_step()
        wrappers = list(collector._pool)
        resets, closes = [], []
        for w, task in zip(wrappers, tasks):
            t = time.perf_counter()
            w.reset(options={"task": task})  # releases the tree's snapshots and ends the episode's lineage
            resets.append(time.perf_counter() - t)
        for w in wrappers:  # a live episode again (on Arithmetic a cell: a new lineage) for close() to end
            w.step(w.base.example_actions()[0])
        for w in wrappers:
            t = time.perf_counter()
            w.close()
            closes.append(time.perf_counter() - t)
        collector._pool.clear()
        t = time.perf_counter()
        drained = reaper.wait(120.0)
        row.update(episodes_closed=len(wrappers), reset_median_ms=1e3 * statistics.median(resets),
                   reset_p99_ms=1e3 * pct(resets, 0.99), close_median_ms=1e3 * statistics.median(closes),
                   close_p99_ms=1e3 * pct(closes, 0.99), teardown_s=time.perf_counter() - t, drained=drained,
                   left_after_close=len(sandbox_processes()))
    except OSError as e:  # a host limit: descriptors (EMFILE), processes (EAGAIN), memory (ENOMEM)
        row["stopped_by"] = f"{type(e).__name__}: {e}"
    finally:
        collector.close()
        reaper.wait(120.0)
    row["host_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row["load_average"] = os.getloadavg()[0]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="K = 16 and 32 only")
    parser.add_argument("--minutes", type=float, default=float("inf"),
                        help="start no new K after this many minutes (the rows say where it stopped)")
    args = parser.parse_args()
    ladder = [16, 32] if args.quick else [64, 128, 256, 512, 1024]
    start_template()
    math_tasks = EnvFactory.of(lambda: ArithmeticEnv(n_tasks=2000, difficulty=1)).tasks()
    qa = env_factory("trace/HotpotQA-v0")
    expert = ExpertPolicy(lambda s: qa.expert(noise=0.0, seed=s))
    envs = {
        "arithmetic": (lambda: ArithmeticEnv(tasks=math_tasks), Cells(), math_tasks,
                       ["grpo", "treepo", "every node"]),
        "hotpotqa": (qa, expert, qa.tasks(), ["grpo", "treepo"]),
    }
    rows: list[dict] = []
    stopped: set[tuple[str, str]] = set()
    began = time.monotonic()
    for k in ladder:  # K outermost: a time budget that runs out leaves every policy measured up to some K
        for env_name, (make_env, policy, tasks, labels) in envs.items():
            for label in labels:
                if (env_name, label) in stopped:
                    continue
                reason = None
                prev = next((r for r in reversed(rows) if r["env"] == env_name and r["policy"] == label
                             and "pss_mb" in r), None)
                if label == "every node" and k > 256:
                    reason = "the earlier policy is a reference: run up to K = 256 only"
                elif prev is not None and (prev["pss_mb"] * 2**20 * k / prev["K"]
                                           + prev["host_rss_mb"] * 2**20) > MEMORY_CAP:
                    reason = f"memory: K = {k} would pass {MEMORY_CAP >> 30} GiB"
                elif time.monotonic() - began > 60 * args.minutes:
                    reason = f"time: the {args.minutes}-minute budget was spent"
                row = ({"env": env_name, "policy": label, "K": k, "stopped_by": reason} if reason
                       else run(env_name, make_env, policy, tasks, label, k))
                rows.append(row)
                print(format_row(row), flush=True)
                if "stopped_by" in row:
                    stopped.add((env_name, label))
    qa.close()
    print()
    print(HEADER)
    for r in rows:
        print(format_row(r))
    print(f"\nload average {os.getloadavg()[0]:.1f} on {machine()['cpus']} cores")
    print(f"wrote {write_json('scale_quick' if args.quick else 'scale', {'rows': rows, 'machine': machine()})}")


HEADER = (f"{'env':<11}{'policy':<11}{'K':>5}{'procs':>7}{'/traj':>6}{'PSS MB':>8}{'MB/traj':>8}{'fds':>6}"
          f"{'step ms':>8}{'p99':>7}{'reset ms':>9}{'close ms':>9}{'teardown s':>11}{'wall s':>8}{'load':>6}")


def format_row(r: dict) -> str:
    if "processes" not in r:
        return f"{r['env']:<11}{r['policy']:<11}{r['K']:>5}  stopped: {r.get('stopped_by')}"
    k = r["trajectories"]
    return (f"{r['env']:<11}{r['policy']:<11}{r['K']:>5}{r['processes']:>7}{r['processes'] / k:>6.2f}"
            f"{r['pss_mb']:>8.0f}{r['pss_mb'] / k:>8.2f}{r['fds']:>6}{r['step_median_ms']:>8.1f}"
            f"{r['step_p99_ms']:>7.0f}{r.get('reset_median_ms', float('nan')):>9.2f}"
            f"{r.get('close_median_ms', float('nan')):>9.2f}{r.get('teardown_s', float('nan')):>11.2f}"
            f"{r['step_wall_s']:>8.1f}{r['load_average']:>6.1f}")


if __name__ == "__main__":
    main()
