"""torch beside other work: the tiny model's SFT rate alone and beside busy processes, with torch's own thread
settings and with trace-gym's (``trace_gym.threads``: the cores this process may use less the tasks of others
that want a CPU, re-read every few seconds; and SFT of a small model split over one single-threaded process per
core, ``agents/data_parallel.py``).

Each cell is a fresh Python process (OpenMP reads its settings when torch loads) that runs SFT steps of the tiny
model on scripted-expert Arithmetic episodes for ``--seconds`` and reports steps per second; "busy" cells run
beside ``--busy`` processes that spin on the CPU for the whole cell. The figure is each policy's rate beside the
busy processes over its rate alone, measured in the same run (machines are noisy, ratios less so), repeated
``--repeats`` times. Writes benchmarks/results/threads.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine, write_json

WORKER = r"""
import json, os, sys, time
policy, seconds, model_dir, batch = json.loads(sys.argv[1]), float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
env_kwargs = json.loads(sys.argv[5])
if policy.get("trace_gym"):
    from trace_gym import threads
    threads.configure()
import torch
if policy.get("threads"):
    torch.set_num_threads(policy["threads"])
from trace_gym.agents.sft import SMALL, SFTSettings, sft
from trace_gym.env_specs import env_factory
from trace_gym.training.driver.warm_start import collect_expert_episodes
episodes = collect_expert_episodes(env_factory("trace/Arithmetic-v0", {"n_tasks": 64, **env_kwargs}), 64)
times = []
def on_step(step, loss, model):
    times.append(time.perf_counter())
    if times[-1] - times[0] > seconds:
        raise StopIteration
settings = SFTSettings(steps=100000, batch_size=batch, seed=0, processes=policy.get("processes", 1))
processes = settings.resolved(SMALL - 1).processes  # the tiny model is small
try:
    sft(model_dir, episodes, out_dir=model_dir + "-out", on_step=on_step, progress=False, config=settings)
except StopIteration:
    pass
steps = len(times) - 1
print(json.dumps({"steps": steps, "rate": steps / (times[-1] - times[0]), "processes": processes,
                  "threads": 1 if processes > 1 else torch.get_num_threads()}))
"""

SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end:\n    pass\n"


# name -> how a cell sets torch's threads: trace-gym's choice (``configure``, and SFT's default process count), or
# a fixed count in one process, or ``processes`` of one thread each (agents/data_parallel.py); ``env`` is set before
# torch loads (OpenMP reads it then). ``GOMP_SPINCOUNT`` bounds how long a waiting OpenMP thread spins before it
# sleeps (libgomp's default spins ~300,000 times while it has a core of its own, ~100 times when the process has
# more OpenMP threads than cores).
POLICIES: dict[str, dict[str, Any]] = {
    "torch-default": {},
    "trace-gym": {"trace_gym": True, "processes": None},
    "2-processes": {"processes": 2},
    "1-thread": {"threads": 1, "env": {"OMP_NUM_THREADS": "1"}},
    "2-threads": {"threads": 2, "env": {"OMP_NUM_THREADS": "2"}},
    "2-threads-spin-1k": {"threads": 2, "env": {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "1000"}},
    "2-threads-spin-10k": {"threads": 2, "env": {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "10000"}},
    "2-threads-spin-100k": {"threads": 2, "env": {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "100000"}},
    "2-threads-passive": {"threads": 2, "env": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}},
    "3-threads": {"threads": 3, "env": {"OMP_NUM_THREADS": "3"}},
    "4-threads": {"threads": 4, "env": {"OMP_NUM_THREADS": "4"}},
}
_OWN = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "TRACE_GYM_THREADS")


def cell(policy: str, busy: int, seconds: float, model_dir: str, batch: int,
         env_kwargs: dict[str, Any]) -> dict[str, float]:
    """One fresh process running SFT for ``seconds`` beside ``busy`` spinning processes: its rate and threads."""
    spec = POLICIES[policy]
    env = {k: v for k, v in os.environ.items() if k not in _OWN} | spec.get("env", {})
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN.format(s=seconds + 90)]) for _ in range(busy)]
    try:
        out = subprocess.run([sys.executable, "-c", WORKER, json.dumps(spec), str(seconds), model_dir, str(batch),
                              json.dumps(env_kwargs)],
                             env=env, capture_output=True, text=True, timeout=seconds + 600)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="SFT time per cell")
    parser.add_argument("--busy", type=int, nargs="+", default=[2],
                        help="numbers of spinning processes beside the busy cells (0, alone, is always run)")
    parser.add_argument("--policies", nargs="+", default=["torch-default", "trace-gym"], choices=sorted(POLICIES))
    parser.add_argument("--batch", type=int, default=8, help="SFT batch size (the quickstart's is 32)")
    parser.add_argument("--env-kwargs", type=json.loads, default={}, help="Arithmetic's settings for the episodes, "
                        "as JSON; the quickstart's: '{\"word_fraction\": 0, \"config\": {\"min_ops\": 2, "
                        "\"max_ops\": 3, \"min_digits\": 1, \"max_digits\": 2}}'")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="10 s cells, one repeat")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.repeats = 10.0, 1
    from trace_gym.agents.tiny import build_tiny_model

    model_dir = str(build_tiny_model(Path("runs/bench/threads-model"), size="tiny", seed=0))
    levels = [0, *sorted(set(args.busy) - {0})]  # --busy 0: alone only
    # results[policy][busy] = {"rate": [...], "threads": [...], "processes": [...]} over repeats
    results: dict[str, dict[str, dict[str, list[float]]]] = {p: {} for p in args.policies}
    load0 = os.getloadavg()[0]
    start = time.perf_counter()
    for rep in range(args.repeats):
        for busy in levels:  # interleaved: a drift of the machine hits every policy alike
            for policy in args.policies:
                out = cell(policy, busy, args.seconds, model_dir, args.batch, args.env_kwargs)
                r = results[policy].setdefault(str(busy), {"rate": [], "threads": [], "processes": []})
                r["processes"].append(out["processes"])
                r["rate"].append(out["rate"])
                r["threads"].append(out["threads"])
                print(f"repeat {rep}: {policy:20s} beside {busy} busy: {out['rate']:.2f} step/s "
                      f"({out['processes']} x {out['threads']} threads)", flush=True)
    ratios = {p: {b: [x / a for x, a in zip(r[b]["rate"], r["0"]["rate"])] for b in r if b != "0"}
              for p, r in results.items()}
    head = "".join(f"{'beside ' + str(b):>22s}" for b in levels)
    print(f"\nstep/s (range over repeats; busy / alone in brackets)\n{'policy':22s}{head}")
    for policy, r in results.items():
        cells = []
        for b in levels:
            x = r[str(b)]["rate"]
            rr = ratios[policy].get(str(b))
            cells.append(f"{min(x):.2f}-{max(x):.2f}" + (f" ({min(rr):.2f}-{max(rr):.2f})" if rr else ""))
        print(f"{policy:22s}" + "".join(f"{c:>22s}" for c in cells))
    path = write_json("threads", {"machine": machine(), "settings": vars(args), "load_at_start": load0,
                                  "seconds": time.perf_counter() - start, "results": results, "ratios": ratios})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
