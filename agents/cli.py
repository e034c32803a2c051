"""`trace-gym model init` and `trace-gym sft` (wired into the `trace-gym` command by trace_gym.cli)."""

from __future__ import annotations

import argparse
import json


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    if command == "model":
        parser.add_argument("action", choices=["init"], help="init: build the tiny model from config")
        parser.add_argument("--out", required=True, help="model folder to write")
        parser.add_argument("--size", choices=["nano", "tiny"], default="tiny", help="nano ~0.2M, tiny ~0.8M")
        parser.add_argument("--seed", type=int, default=0)
    elif command == "sft":
        from trace_gym.agents.sft import SFTConfig

        d = SFTConfig()
        parser.add_argument("--model", required=True, help="model folder to fine-tune")
        parser.add_argument("--env", default="trace/Arithmetic-v0", help="env id whose scripted expert teaches")
        parser.add_argument("--episodes", type=int, default=2000, help="expert episodes to collect")
        parser.add_argument("--out", default=None, help="output folder (default: the model folder, in place)")
        parser.add_argument("--steps", type=int, default=d.steps)
        parser.add_argument("--batch-size", type=int, default=d.batch_size)
        parser.add_argument("--lr", type=float, default=d.lr)
        parser.add_argument("--seed", type=int, default=d.seed)
        parser.add_argument("--noise", type=float, default=0.0, help="expert noise (failed episodes are dropped)")
        parser.add_argument("--eval-episodes", type=int, default=100, help="held-out tasks to evaluate on")
        parser.add_argument("--env-kwargs", default="{}", help="JSON keyword arguments for gym.make")


def run(command: str, args: argparse.Namespace) -> int:
    if command == "model":
        from trace_gym.agents.tiny import build_tiny_model

        out = build_tiny_model(args.out, size=args.size, seed=args.seed)
        print((out / "trace_gym_model.json").read_text().strip(), "->", out)
        return 0
    from trace_gym.agents.sft import SFTConfig, sft_env

    config = SFTConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    summary = sft_env(args.model, args.env, episodes=args.episodes, out_dir=args.out, config=config,
                      eval_episodes=args.eval_episodes, noise=args.noise, env_kwargs=json.loads(args.env_kwargs))
    print(json.dumps(summary, indent=2))
    return 0
