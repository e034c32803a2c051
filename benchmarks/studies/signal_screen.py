"""Screen policy-update settings with the shuffled-advantage check (benchmarks/studies/signal_check.py).

One trainer (configs/quickstart_copying.yaml on Arithmetic, one warm start, ``--set`` overrides for the rollouts)
collects ``--repeats`` step batches once; then for each ``--setting NAME:key=value,key=value`` (optimiser
overrides) the update is applied with true and with shuffled advantages from the same weights, evaluated
paired on the same held-out prompts. Rows go to ``--log`` (JSONL).

    .venv/bin/python benchmarks/studies/signal_screen.py --set alloc.allocator=grpo alloc.roots=128 \\
        alloc.multiplier=0 alloc.pool_size=16 --setting adam2e-4:optim.lr=2e-4 nsgd:optim.optimizer=normalized_sgd
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch
from _study import ENV, STUDY_RUNS, arith_kwargs, log_run, train_config, trainer, warm_start

from benchmarks.studies.normalized_sgd import NormalizedSGD
from benchmarks.studies.signal_check import HeldOut, collect_batches, signal_check
from trace_gym.training.update.optimizers import make_optimizer

NSGD_SETTING = "optim.optimizer=normalized_sgd"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="screen")
    p.add_argument("--set", nargs="*", default=[], help="trainer overrides shared by every setting")
    p.add_argument("--setting", nargs="+", required=True, help="NAME:key=value,key=value (optimiser overrides)")
    p.add_argument("--sft-steps", type=int, default=400)
    p.add_argument("--difficulty", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--measure", default="expert", choices=("expert", "sampled"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", type=Path, default=Path("benchmarks/studies/logs/signal_screen.jsonl"))
    args = p.parse_args()
    torch.set_num_threads(2)
    model_path = warm_start(args.sft_steps)
    kw = arith_kwargs(args.difficulty)
    ev = arith_kwargs(args.difficulty, n_tasks=args.tasks, task_seed=1)
    shared = [f"seed={args.seed}", f"env.kwargs={json.dumps(kw)}", f"env.eval_kwargs={json.dumps(ev)}", *args.set]
    t = trainer(STUDY_RUNS / "signal" / args.name, model_path, shared)
    try:
        t0 = time.perf_counter()
        batches = collect_batches(t, args.repeats, args.seed)
        held = HeldOut(t, args.tasks, args.samples, args.measure)
        base = held(7)
        print(f"{args.repeats} batches ({[len(b[0]) for b in batches]} nodes) and base {base.mean():.4f} in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        for spec in args.setting:
            name, _, rest = spec.partition(":")
            # split on commas outside brackets, so that optim.betas=[0.9,0.99] stays one override
            overrides = [x for x in re.split(r",(?![^\[]*\])", rest) if x]
            nsgd = NSGD_SETTING in overrides  # a study optimiser: the config does not know it
            overrides = [x for x in overrides if x != NSGD_SETTING]
            cfg = train_config(ENV, STUDY_RUNS / "signal" / args.name, [f"model.path={model_path}", *shared,
                                                                          *overrides])
            t.cfg.optim = cfg.optim
            o = cfg.optim
            params = [q for q in t.learner.module.parameters() if q.requires_grad]
            t.learner.optimizer = NormalizedSGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay) \
                if nsgd else make_optimizer(params, o.optimizer, lr=o.lr, betas=o.betas, eps=o.eps,
                                            weight_decay=o.weight_decay, momentum=o.momentum)
            updates: list[dict[str, float]] = []
            update = t.learner.update
            t.learner.update = lambda *a, _u=update, _r=updates: _r.append(_u(*a)) or _r[-1]  # type: ignore[method-assign]
            t1 = time.perf_counter()
            try:
                out = signal_check(t, seed=args.seed, batches=batches, held=held, base=base)
            finally:
                t.learner.update = update  # type: ignore[method-assign]
            row = {"name": name, "shared": args.set, "overrides": overrides, "sft_steps": args.sft_steps,
                   "difficulty": args.difficulty, "seed": args.seed,
                   **{k: (v.__dict__ if hasattr(v, "__dict__") else v) for k, v in out.items()},
                   "grad_norm": [u.get("loss/grad_norm") for u in updates],
                   "optimizer_steps": [u.get("loss/optimizer_steps") for u in updates],
                   "wall_s": time.perf_counter() - t1}
            log_run(args.log, row)
            print(f"{name:28s} before {out['before']:.4f}  true-before {out['true_vs_before']}  shuffled-before "
                  f"{out['shuffled_vs_before']}  true-shuffled {out['true_vs_shuffled']}  nodes {out['nodes']:.0f}"
                  f"  grad norm {row['grad_norm']}  ({row['wall_s']:.0f} s)", flush=True)
    finally:
        t.close()


if __name__ == "__main__":
    main()
