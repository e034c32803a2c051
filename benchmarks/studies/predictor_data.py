"""Collect the predictor study's data: rollout trees of every prompt of a small Arithmetic task set, visited
several times at the fixed warm-started policy (as RL revisits prompts across epochs), plus per-prompt
policy features that cost no rollout budget beyond one greedy first turn.

Per visit and prompt: ``--group`` bare rollouts (a RolloutTree with recorded tokens and logprobs). Per
prompt, once: the greedy first turn's summed and minimum token log-probability at T = 1 (what the policy
would most likely do, and how sure it is). Writes runs/studies/predictor/<case>/visits.jsonl and
features.json; predictor_study.py replays them.

    .venv/bin/python benchmarks/studies/predictor_data.py --case level2 --difficulty 2
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from _study import STUDY_RUNS, arith_kwargs, trainer, warm_start

from trace_gym.agents.policy import Request, SamplingParams
from trace_gym.seeds import derive


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", required=True)
    p.add_argument("--difficulty", type=int, default=None)
    p.add_argument("--tasks", type=int, default=256)
    p.add_argument("--visits", type=int, default=3)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--sft-steps", type=int, default=400)
    args = p.parse_args()
    torch.set_num_threads(2)
    out = STUDY_RUNS / "predictor" / args.case
    out.mkdir(parents=True, exist_ok=True)
    kw = arith_kwargs(args.difficulty, n_tasks=args.tasks, task_seed=7)
    t = trainer(out / "run", warm_start(args.sft_steps), [f"env.kwargs={json.dumps(kw)}", "alloc.allocator=grpo"])
    tasks = t.stream.tasks
    t0 = time.perf_counter()
    try:
        # Greedy first turn per prompt: one generation, no env step (prompt ids as the collector renders them).
        features = {}
        gens = []
        prompt_ids = {}
        from trace_gym.agents.chat import Conversation

        with t.make_env.reading() as env:
            for task in tasks:
                _, info = env.reset(options={"task": task})
                prompt_ids[task.id] = Conversation.start(t.tokenizer, info["messages"], None).ids
        greedy = SamplingParams(temperature=0.0, max_new_tokens=t.cfg.rollout.max_new_tokens)
        for s in range(0, len(tasks), 64):
            part = tasks[s:s + 64]
            gens += t.policy.generate([Request(prompt_ids=prompt_ids[x.id]) for x in part], greedy)
        for task, g in zip(tasks, gens):
            lp = np.array(g.logprobs or [0.0])
            features[task.id] = {"greedy_sum": float(lp.sum()), "greedy_min": float(lp.min()),
                                 "greedy_text": g.text, "ops": task.meta.get("ops")}
        (out / "features.json").write_text(json.dumps(features))
        print(f"features {time.perf_counter() - t0:.0f} s", flush=True)
        with open(out / "visits.jsonl", "w") as f:
            for v in range(args.visits):
                t1 = time.perf_counter()
                t.collector.begin_step()
                t.collector.bare_rollouts({x.id: args.group for x in tasks}, seed=derive(11, v, 0))
                trees = list(t.collector.trees.values())
                f.writelines(json.dumps({"visit": v, **tree.to_dict()}) + "\n" for tree in trees)
                succ = np.mean([tree.value(0) for tree in trees])
                print(f"visit {v}: {len(trees)} prompts, success {succ:.3f}, {time.perf_counter() - t1:.0f} s",
                      flush=True)
    finally:
        t.close()


if __name__ == "__main__":
    main()
