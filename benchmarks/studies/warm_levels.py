"""Where the warm start stands on each Arithmetic mix: sampled (T = 1) and greedy held-out success, and the
teacher-forced expert probability (the screening proxy), per prompt, with wall times.

    .venv/bin/python benchmarks/studies/warm_levels.py --sft-steps 400 --difficulty 3 4
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from _study import (
    arith_kwargs,
    env_factory,
    expert_logprob,
    expert_sequences,
    load,
    log_run,
    sampled_success,
    tasks_of,
    warm_start,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sft-steps", type=int, nargs="+", default=[400])
    p.add_argument("--difficulty", type=int, nargs="+", default=[3])
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--log", type=Path, default=Path("benchmarks/studies/logs/warm_levels.jsonl"))
    args = p.parse_args()
    torch.set_num_threads(2)
    for sft_steps in args.sft_steps:
        model, tok = load(warm_start(sft_steps))
        for d in args.difficulty:
            make_env = env_factory(arith_kwargs(d, n_tasks=args.tasks, task_seed=1))
            tasks = tasks_of(make_env, args.tasks)
            t0 = time.perf_counter()
            expert = np.exp(expert_logprob(model, expert_sequences(make_env, tasks, tok), tok.pad_token_id))
            t1 = time.perf_counter()
            sampled = sampled_success(model, tok, make_env, tasks, args.samples, seed=99)
            t2 = time.perf_counter()
            greedy = sampled_success(model, tok, make_env, tasks, 1, seed=0, temperature=0.0)
            t3 = time.perf_counter()
            corr = float(np.corrcoef(expert, sampled)[0, 1])
            row = {"sft_steps": sft_steps, "difficulty": d, "tasks": len(tasks), "samples": args.samples,
                   "sampled": float(sampled.mean()), "greedy": float(greedy.mean()), "expert": float(expert.mean()),
                   "expert_vs_sampled_corr": corr, "expert_s": t1 - t0, "sampled_s": t2 - t1, "greedy_s": t3 - t2,
                   "mixed_share_4": float(np.mean((sampled > 0) & (sampled < 1)))}
            log_run(args.log, row)
            print(row, flush=True)


if __name__ == "__main__":
    main()
