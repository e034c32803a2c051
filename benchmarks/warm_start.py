"""The tiny model's SFT warm start on trace/Arithmetic-v0 at the quickstart's settings (docs/measured.md).

Measures held-out greedy success along the SFT steps (when the model learns to copy the tool's output), the
seconds per SFT step, and how the warm-started policy spreads held-out prompts over success probability
(``--samples`` samples per prompt at T = 1: all fail, all succeed, mixed). The model is built fresh in a
temporary folder; nothing is cached. Writes benchmarks/results/warm_start[_quick].json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import QUICKSTART, machine, write_json

ENV = "trace/Arithmetic-v0"


def success(policy: Any, make_env: Any, tasks: list[Any], samples: int, temperature: float, max_new_tokens: int,
            tokenizer: Any, seed: int) -> list[float]:
    """Per-prompt success of ``policy`` (bare rollouts through the collector)."""
    from trace_gym.agents.policy import SamplingParams
    from trace_gym.training.rollout.collector import TreeCollector
    from trace_gym.training.rollout.evaluate import evaluate

    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    collector = TreeCollector(policy, make_env, tasks, sampling, tokenizer, "replay", workers=2, max_context=1024)
    try:
        return [t.success for t in evaluate(collector, tasks, samples, seed).tasks]
    finally:
        collector.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="evaluate at fewer steps, on 40 prompts")
    parser.add_argument("--eval-tasks", type=int, default=None, help="held-out prompts (default 100; 40 quick)")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt for the difficulty spread")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from trace_gym.agents.hf import HFPolicy
    from trace_gym.agents.sft import SFTSettings, sft
    from trace_gym.agents.tiny import build_tiny_model
    from trace_gym.env_specs import env_factory, env_tasks
    from trace_gym.training.config import load_config
    from trace_gym.training.driver.warm_start import collect_expert_episodes

    cfg = load_config(QUICKSTART)
    n_eval = args.eval_tasks or (40 if args.quick else 100)
    at = {100, 250, 400} if args.quick else {50, 100, 150, 200, 250, 300, 350, 400}
    make_env = env_factory(ENV, cfg.env.kwargs)
    make_eval_env = env_factory(ENV, {**cfg.env.kwargs, **cfg.env.eval_kwargs})
    tasks = env_tasks(make_eval_env)[:n_eval]
    start = time.perf_counter()
    curve: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = build_tiny_model(Path(tmp) / "init", size="tiny", seed=cfg.seed)
        tokenizer = AutoTokenizer.from_pretrained(base)
        t0 = time.perf_counter()
        data = collect_expert_episodes(make_env, cfg.sft.episodes, noise=cfg.sft.noise, seed=cfg.seed)
        collect_s = time.perf_counter() - t0
        train_s = [0.0]
        last = [time.perf_counter()]

        def on_step(step: int, loss: float, model: Any) -> None:
            if step > 0:  # step 0's interval also holds loading the model and tokenising the episodes
                train_s[0] += time.perf_counter() - last[0]
            if step + 1 in at:
                model.eval()
                s = success(HFPolicy(model, tokenizer), make_eval_env, tasks, 1, 0.0, cfg.rollout.max_new_tokens,
                            tokenizer, 0)
                model.train()
                curve.append({"step": step + 1, "loss": loss, "greedy_success": float(np.mean(s))})
                print(f"  SFT step {step + 1}: loss {loss:.4f}, held-out greedy success {np.mean(s):.3f}", flush=True)
            last[0] = time.perf_counter()

        settings = SFTSettings(steps=cfg.sft.steps, batch_size=cfg.sft.batch_size, lr=cfg.sft.lr, seed=cfg.seed)
        sft(base, data, Path(tmp) / "sft", settings, progress=False, on_step=on_step)
        policy = HFPolicy.from_pretrained(Path(tmp) / "sft")
        per_prompt = np.array(success(policy, make_eval_env, tasks, args.samples, 1.0, cfg.rollout.max_new_tokens,
                                      policy.tokenizer, 1))
    spread = {"prompts": len(per_prompt), "samples": args.samples, "mean": float(per_prompt.mean()),
              "all_fail": float(np.mean(per_prompt == 0)), "all_success": float(np.mean(per_prompt == 1)),
              "mixed": float(np.mean((per_prompt > 0) & (per_prompt < 1)))}
    print(f"warm-started policy at T=1, {args.samples} samples x {len(per_prompt)} prompts: {spread}")
    payload = {"machine": machine(), "env": ENV, "episodes": len(data), "collect_s": collect_s,
               "sft_s_per_step": train_s[0] / (cfg.sft.steps - 1), "curve": curve, "spread": spread,
               "seconds": time.perf_counter() - start}
    print(f"expert episodes: {len(data)} in {collect_s:.1f} s; SFT {payload['sft_s_per_step']:.3f} s/step")
    path = write_json("warm_start_quick" if args.quick else "warm_start", payload)
    print(f"wrote {path} in {payload['seconds']:.0f} s")


if __name__ == "__main__":
    main()
