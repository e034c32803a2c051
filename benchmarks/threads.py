"""torch beside other work: the tiny model's SFT rate alone and beside busy processes, with torch's own thread
settings and with trace-gym's (``trace_gym.threads``: the cores this process may use less the tasks of others
that want a CPU, re-read every few seconds).

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

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine, write_json

WORKER = r"""
import json, os, sys, time
policy, seconds, model_dir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
if policy == "trace-gym":
    from trace_gym import threads
    threads.configure()
import torch
from trace_gym.agents.sft import SFTSettings, sft
from trace_gym.env_specs import env_factory
from trace_gym.training.driver.warm_start import collect_expert_episodes
episodes = collect_expert_episodes(env_factory("trace/Arithmetic-v0", {"n_tasks": 64}), 64)
times = []
def on_step(step, loss, model):
    times.append(time.perf_counter())
    if times[-1] - times[0] > seconds:
        raise StopIteration
try:
    sft(model_dir, episodes, out_dir=model_dir + "-out", config=SFTSettings(steps=100000, batch_size=8, seed=0),
        on_step=on_step, progress=False)
except StopIteration:
    pass
steps = len(times) - 1
print(json.dumps({"steps": steps, "rate": steps / (times[-1] - times[0]), "threads": torch.get_num_threads()}))
"""

SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end:\n    pass\n"


def cell(policy: str, busy: int, seconds: float, model_dir: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY",
                                                            "TRACE_GYM_THREADS")}
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN.format(s=seconds + 90)]) for _ in range(busy)]
    try:
        out = subprocess.run([sys.executable, "-c", WORKER, policy, str(seconds), model_dir], env=env,
                             capture_output=True, text=True, timeout=seconds + 600)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=40.0, help="SFT time per cell")
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside the busy cells")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="10 s cells, one repeat")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.repeats = 10.0, 1
    from trace_gym.agents.tiny import build_tiny_model

    model_dir = str(build_tiny_model(Path("runs/bench/threads-model"), size="tiny", seed=0))
    results: dict[str, dict[str, list[float]]] = {}
    load0 = os.getloadavg()[0]
    start = time.perf_counter()
    for rep in range(args.repeats):
        for policy in ("torch-default", "trace-gym"):
            alone = cell(policy, 0, args.seconds, model_dir)
            beside = cell(policy, args.busy, args.seconds, model_dir)
            r = results.setdefault(policy, {"alone": [], "busy": [], "ratio": [], "threads_busy": []})
            r["alone"].append(alone["rate"])
            r["busy"].append(beside["rate"])
            r["ratio"].append(beside["rate"] / alone["rate"])
            r["threads_busy"].append(beside["threads"])
            print(f"repeat {rep}: {policy:14s} alone {alone['rate']:.2f} step/s ({alone['threads']} threads), "
                  f"beside {args.busy} busy {beside['rate']:.2f} step/s ({beside['threads']} threads): ratio "
                  f"{beside['rate'] / alone['rate']:.2f}", flush=True)
    print(f"\n{'policy':16s}{'alone step/s':>16s}{'busy step/s':>16s}{'busy / alone':>16s}")
    for policy, r in results.items():
        print(f"{policy:16s}{np.mean(r['alone']):16.2f}{np.mean(r['busy']):16.2f}"
              f"{min(r['ratio']):8.2f}-{max(r['ratio']):.2f}")
    path = write_json("threads", {"machine": machine(), "settings": vars(args), "load_at_start": load0,
                                  "seconds": time.perf_counter() - start, "results": results})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
