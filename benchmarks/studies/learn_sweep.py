"""Driver sweep: RL runs of the tiny model from one warm start, held-out gain measured paired.

Each setting is a list of trainer config overrides on top of configs/quickstart_copying.yaml (Arithmetic, the
always-tool setting). Every run starts from the same warm start; the held-out prompts are the same for all
runs (the eval split's first ``--eval-tasks``), evaluated before (cached per warm start and eval set) and
after ``--steps`` steps (and every ``--eval-every``), sampled at T = 1 with a fresh seed per evaluation, and
by the teacher-forced expert probability. Rows go to ``--log`` (JSONL) and a table is printed.

    .venv/bin/python benchmarks/studies/learn_sweep.py --name lr2e-4 --set optim.lr=2e-4 alloc.allocator=grpo
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import torch
from _study import (
    STUDY_RUNS,
    arith_kwargs,
    env_factory,
    expert_logprob,
    expert_sequences,
    fmt,
    log_run,
    paired,
    sampled_success,
    tasks_of,
    trainer,
    warm_start,
)

from benchmarks.studies.signal_check import shuffled

CACHE = STUDY_RUNS / "base_evals"


def evaluate(model, tok, make_env, tasks, expert, samples: int, seed: int) -> dict[str, np.ndarray]:
    out = {"expert": np.exp(expert_logprob(model, expert, tok.pad_token_id))}
    if samples:
        out["sampled"] = sampled_success(model, tok, make_env, tasks, samples, seed)
    return out


def base_eval(model_path: str, difficulty: int | None, n: int, samples: int, tok, model, make_env, tasks,
              expert) -> dict[str, np.ndarray]:
    key = hashlib.sha1(json.dumps([model_path, difficulty, n, samples]).encode()).hexdigest()[:12]
    path = CACHE / f"{key}.json"
    if path.is_file():
        return {k: np.array(v) for k, v in json.loads(path.read_text()).items()}
    t0 = time.perf_counter()
    out = evaluate(model, tok, make_env, tasks, expert, samples, seed=12345)
    print(f"base eval {time.perf_counter() - t0:.0f} s: " + ", ".join(f"{k} {v.mean():.3f}" for k, v in out.items()),
          flush=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: v.tolist() for k, v in out.items()}))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True)
    p.add_argument("--set", nargs="*", default=[], help="trainer config overrides")
    p.add_argument("--sft-steps", type=int, default=400)
    p.add_argument("--difficulty", type=int, default=None, help="Arithmetic level of train and eval prompts")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-tasks", type=int, default=200)
    p.add_argument("--eval-samples", type=int, default=4,
                   help="sampled episodes per prompt at the last step (and before); 0: expert probability only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shuffle", action="store_true",
                   help="control run: every update gets its advantages permuted over the trained nodes (no signal)")
    p.add_argument("--log", type=Path, default=Path("benchmarks/studies/logs/learn_sweep.jsonl"))
    args = p.parse_args()
    torch.set_num_threads(2)
    model_path = warm_start(args.sft_steps)
    eval_kwargs = arith_kwargs(args.difficulty, n_tasks=args.eval_tasks, task_seed=1)
    make_eval = env_factory(eval_kwargs)
    tasks = tasks_of(make_eval, args.eval_tasks)
    train_kwargs = arith_kwargs(args.difficulty)
    run_dir = STUDY_RUNS / "learn" / args.name / f"seed{args.seed}"
    t = trainer(run_dir, model_path, [f"seed={args.seed}", f"env.kwargs={json.dumps(train_kwargs)}",
                                      f"steps={args.steps}", *args.set])
    tok, model = t.tokenizer, t.learner.model
    if args.shuffle:  # the same run with the advantages' link to outcomes cut: what the steps do without signal
        rng, update = np.random.default_rng(args.seed), t.learner.update
        t.learner.update = lambda samples, *a, **k: update(shuffled(samples, rng), *a, **k)  # type: ignore[method-assign]
    expert = expert_sequences(make_eval, tasks, tok)
    base = base_eval(model_path, args.difficulty, args.eval_tasks, args.eval_samples, tok, model, make_eval, tasks,
                     expert)
    train_s, train_cpu, rows = 0.0, 0.0, []
    try:
        for step in range(1, args.steps + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            m = t.step()
            train_s += time.perf_counter() - t0
            train_cpu += time.process_time() - c0
            rows.append({k: m.get(k) for k in ("alloc/effective_ratio", "rollout/success", "loss/nodes",
                                                "loss/optimizer_steps", "loss/grad_norm", "loss/clip_frac",
                                                "loss/approx_kl_behaviour", "time/step_s")})
            if step % args.eval_every == 0 or step == args.steps:
                t1, c1 = time.perf_counter(), time.process_time()
                after = evaluate(model, tok, make_eval, tasks, expert, args.eval_samples if step == args.steps else 0,
                                 seed=1000 * args.seed + step)
                eval_s, eval_cpu = time.perf_counter() - t1, time.process_time() - c1
                gains = {k: paired(base[k], after[k]) for k in after}
                recent = rows[-args.eval_every:]
                row = {"name": args.name, "shuffle": args.shuffle, "set": args.set, "sft_steps": args.sft_steps,
                       "difficulty": args.difficulty, "seed": args.seed, "step": step,
                       "before": {k: float(v.mean()) for k, v in base.items()},
                       "after": {k: float(v.mean()) for k, v in after.items()},
                       "gain": gains, "train_s": train_s, "eval_s": eval_s, "train_cpu_s": train_cpu,
                       "eval_cpu_s": eval_cpu,
                       "train_success": float(np.mean([r["rollout/success"] for r in recent])),
                       "effective_ratio": float(np.mean([r["alloc/effective_ratio"] for r in recent])),
                       "nodes": float(np.mean([r["loss/nodes"] for r in recent])),
                       "opt_steps": float(np.mean([r["loss/optimizer_steps"] for r in recent])),
                       "grad_norm": float(np.nanmean([r["loss/grad_norm"] or np.nan for r in recent])),
                       "kl": float(np.nanmean([r["loss/approx_kl_behaviour"] or np.nan for r in recent]))}
                log_run(args.log, row)
                print(f"{args.name} step {step}: " + "  ".join(f"{k} {fmt(g)}" for k, g in gains.items())
                      + f"  (after {row['after']}, train {train_s:.0f} s, eval {eval_s:.0f} s, "
                        f"train succ {row['train_success']:.3f}, grad {row['grad_norm']:.3g})", flush=True)
    finally:
        t.close()


if __name__ == "__main__":
    main()
