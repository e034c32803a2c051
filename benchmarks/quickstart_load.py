"""The README's main job beside other work: the quickstart's wall time alone and beside busy processes.

Each cell runs the quickstart as `make quickstart` does (`trace-gym train --config configs/quickstart.yaml`),
from scratch (its warm start included) in a fresh folder under runs/bench/quickstart_load/, and records its wall
time, the warm start's and RL's (from the run's summary), the held-out gain its table printed and the load
average it ran at (sampled every 5 s). "busy" cells run beside ``--busy`` processes that spin on the CPU for the
whole cell, so that the machine's load is about ``--busy`` plus the job's own threads. The figure is the busy
cell's wall time over the idle cell's, measured in the same run; other work on the machine shows in the
recorded load. Writes benchmarks/results/quickstart_load.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine, write_json

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "runs" / "bench" / "quickstart_load"
SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end:\n    pass\n"


def cell(name: str, busy: int, extra: list[str]) -> dict[str, Any]:
    """One quickstart from scratch beside ``busy`` spinning processes."""
    folder = WORK / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    command = [str(Path(sys.executable).parent / "trace-gym"), "train", "--config", "configs/quickstart.yaml",
               f"run_dir={folder / 'rl'}", f"sft.output={folder / 'model-sft'}", "log.progress=false", *extra]
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN.format(s=24 * 3600)]) for _ in range(busy)]
    loads: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(5.0):
            loads.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    try:
        with open(folder / "stdout.log", "w") as log:
            rc = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    finally:
        wall = time.perf_counter() - start
        done.set()
        for p in spinners:
            p.kill()
            p.wait()
    if rc != 0:
        raise RuntimeError(f"the quickstart failed in cell {name} (exit {rc}); see {folder / 'stdout.log'}")
    summary = json.loads((folder / "rl" / "summary.json").read_text())
    return {"busy": busy, "wall_s": wall, "warm_start_s": summary.get("warm_start_s"), "rl_s": summary.get("wall_s"),
            "success_gain": summary["gain"]["success"]["mean"] if "success" in summary.get("gain", {}) else None,
            "load_mean": sum(loads) / len(loads) if loads else None,
            "load_range": [min(loads), max(loads)] if loads else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside the busy cell")
    parser.add_argument("--quick", action="store_true",
                        help="a 40-step warm start and 2 RL steps: the pipeline, not the README's figure")
    args = parser.parse_args()
    extra = ["sft.steps=40", "sft.episodes=200", "steps=2", "eval.tasks=20"] if args.quick else []
    load0 = os.getloadavg()[0]
    cells = {"idle": cell("idle", 0, extra), "busy": cell("busy", args.busy, extra)}
    ratio = cells["busy"]["wall_s"] / cells["idle"]["wall_s"]
    print(f"\n{'cell':8s}{'busy procs':>12s}{'load (mean)':>14s}{'wall s':>10s}{'SFT s':>10s}{'RL s':>10s}"
          f"{'gain':>8s}")
    for name, c in cells.items():
        gain = "-" if c["success_gain"] is None else f"{c['success_gain']:+.3f}"
        load = "-" if c["load_mean"] is None else f"{c['load_mean']:.1f}"
        print(f"{name:8s}{c['busy']:12d}{load:>14s}{c['wall_s']:10.0f}{c['warm_start_s'] or 0:10.0f}"
              f"{c['rl_s'] or 0:10.0f}{gain:>8s}")
    print(f"busy / idle wall time: {ratio:.2f}" + ("  (--quick: not the README's figure)" if args.quick else ""))
    path = write_json("quickstart_load" + ("_quick" if args.quick else ""),
                      {"machine": machine(), "settings": vars(args), "load_at_start": load0, "cells": cells,
                       "busy_over_idle": ratio})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
