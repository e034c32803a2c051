"""``trace-gym sft``: supervised fine-tuning on an env's scripted-expert episodes, evaluated on held-out tasks
before and after (`trace_gym.training.driver.warm_start.sft_env`); prints the summary as JSON."""

from __future__ import annotations

import argparse
import json

from trace_gym.agents.sft import SFTSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option has a help text: the dispatcher's formatter appends its default."""
    d = SFTSettings()
    parser.add_argument("--model", required=True, help="model folder to fine-tune (trace-gym model init)")
    parser.add_argument("--env", default="trace/Arithmetic-v0",
                        help="env whose scripted expert teaches: an id, module:id or module:Class")
    parser.add_argument("--episodes", type=int, default=2000, help="expert episodes to collect")
    parser.add_argument("--out", default=None, help="output folder (default: the model folder, in place)")
    parser.add_argument("--steps", type=int, default=d.steps, help="optimiser steps")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="episodes per step")
    parser.add_argument("--lr", type=float, default=d.lr, help="peak AdamW learning rate")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of batch sampling")
    parser.add_argument("--lora-r", type=int, default=d.lora_r,
                        help="LoRA rank on the attention and MLP projections, merged into the saved model (0: train "
                             "all weights; 16 halves a 135M model's step); as model.lora_r in a run's config")
    parser.add_argument("--lora-alpha", type=int, default=d.lora_alpha,
                        help="LoRA scale numerator (the adapter is scaled by alpha / r)")
    parser.add_argument("--noise", type=float, default=0.0, help="expert noise (failed episodes are dropped)")
    from trace_gym.training.rollout.evaluate import HELD_OUT

    parser.add_argument("--eval-episodes", type=int, default=HELD_OUT.tasks,
                        help="held-out tasks to evaluate on: the first ones of the env with --eval-env-arg, or of the "
                             "training env (its expert episodes then leave them out)")
    parser.add_argument("--eval-env-arg", action="append", metavar="KEY=VALUE",
                        help="a keyword argument of the env for the held-out tasks only (its own split: split=test, "
                             "task_seed=1), as a run's env.eval_kwargs; repeat for several")
    parser.add_argument("--env-arg", action="append", metavar="KEY=VALUE",
                        help="a keyword argument of the env, the value read as YAML (n_tasks=500, max_turns=4), as "
                             "trace-gym eval takes it; repeat for several")


def run(args: argparse.Namespace) -> int:
    """Run `trace-gym sft`; prints the summary as JSON."""
    from trace_gym.agents.specs import check_model_folder
    from trace_gym.env_specs import parse_env_args, resolve_env_spec
    from trace_gym.training.driver.warm_start import sft_env

    check_model_folder(args.model)
    resolve_env_spec(args.env)
    env_kwargs = parse_env_args(args.env_arg or [])
    settings = SFTSettings(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                           lora_r=args.lora_r, lora_alpha=args.lora_alpha)
    summary = sft_env(args.model, args.env, episodes=args.episodes, out_dir=args.out, settings=settings,
                      eval_episodes=args.eval_episodes, noise=args.noise, env_kwargs=env_kwargs,
                      eval_env_kwargs=parse_env_args(args.eval_env_arg or []) or None)
    print(json.dumps(summary, indent=2))
    return 0
