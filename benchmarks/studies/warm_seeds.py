"""How much the quickstart's warm start depends on the seed and the thread count: for each (seed, threads), the
tiny model built with that seed, expert episodes collected with it, SFT with it; then held-out success
(sampled at T = 1) and tool use, on the quickstart's held-out prompts with one evaluation seed, and greedy
success along the SFT steps. Settings default to configs/quickstart.yaml; overrides are dotted pairs.

    .venv/bin/python benchmarks/studies/warm_seeds.py --seeds 0 1 2 --threads 1 --set sft.steps=800
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _study import log_run

ROOT = Path(__file__).resolve().parents[2]


def one(seed: int, threads: int, overrides: list[str], tasks: int, samples: int, every: int,
        keep: Path | None = None) -> dict[str, Any]:
    from trace_gym.agents.hf import HFPolicy
    from trace_gym.agents.policy import SamplingParams
    from trace_gym.agents.sft import SFTSettings, sft
    from trace_gym.agents.tiny import build_tiny_model
    from trace_gym.env_specs import env_factory, env_tasks
    from trace_gym.training.config import load_config
    from trace_gym.training.driver.warm_start import collect_expert_episodes
    from trace_gym.training.rollout.evaluate import evaluate_policy

    torch.set_num_threads(threads)
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", overrides)
    make_env = env_factory(cfg.env.id, cfg.env.kwargs)
    make_eval = env_factory(cfg.env.id, {**cfg.env.kwargs, **cfg.env.eval_kwargs})
    held_out = env_tasks(make_eval)[:tasks]
    curve: list[dict[str, float]] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        base = build_tiny_model(Path(tmp) / "init", size=cfg.model.init_size or "tiny", seed=seed)
        data = collect_expert_episodes(make_env, cfg.sft.episodes, noise=cfg.sft.noise, seed=seed,
                                       expert=cfg.sft.expert)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(base)
        t_sft = time.perf_counter()

        def on_step(step: int, loss: float, model: Any) -> None:
            if every and (step + 1) % every == 0:
                model.eval()
                greedy = evaluate_policy(HFPolicy(model, tok, max_batch_size=64), make_eval, held_out[:100], 1,
                                         SamplingParams(temperature=0.0, max_new_tokens=cfg.rollout.max_new_tokens),
                                         0)
                model.train()
                curve.append({"step": step + 1, "loss": loss, "greedy": greedy.success, "tool": greedy.tool_use})
                print(f"    seed {seed} step {step + 1}: loss {loss:.4f} greedy {greedy.success:.3f} "
                      f"tool {greedy.tool_use:.3f}", flush=True)

        settings = SFTSettings(steps=cfg.sft.steps, batch_size=cfg.sft.batch_size, lr=cfg.sft.lr, seed=seed)
        result = sft(base, data, Path(tmp) / "sft", settings, progress=False, on_step=on_step)
        sft_s = time.perf_counter() - t_sft
        if keep is not None:
            import shutil

            shutil.copytree(Path(tmp) / "sft", keep / f"seed{seed}-threads{threads}", dirs_exist_ok=True)
        policy = HFPolicy.from_pretrained(Path(tmp) / "sft")
        sampled = evaluate_policy(policy, make_eval, held_out, samples,
                                  SamplingParams(temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens),
                                  cfg.seed + 1)
    return {"seed": seed, "threads": threads, "overrides": overrides, "sft_steps": cfg.sft.steps,
            "loss_last": float(np.mean(result.losses[-20:])), "sampled": sampled.success,
            "tool_use": sampled.tool_use, "prompts": len(held_out), "samples": samples, "curve": curve,
            "sft_s": sft_s, "seconds": time.perf_counter() - start}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--set", nargs="*", default=[], help="config overrides, e.g. sft.steps=800")
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--every", type=int, default=0, help="greedy held-out success every N SFT steps (0: off)")
    p.add_argument("--keep", type=Path, default=None, help="copy each warm-started model into this folder")
    p.add_argument("--log", type=Path, default=ROOT / "benchmarks/studies/logs/warm_seeds.jsonl")
    args = p.parse_args()
    for threads in args.threads:
        for seed in args.seeds:
            row = one(seed, threads, args.set, args.tasks, args.samples, args.every, args.keep)
            log_run(args.log, row)
            print(f"seed {seed} threads {threads} {' '.join(args.set)}: sampled {row['sampled']:.3f} tool use "
                  f"{row['tool_use']:.3f} loss {row['loss_last']:.4f} (SFT {row['sft_s']:.0f} s, "
                  f"all {row['seconds']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
