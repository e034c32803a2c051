"""`trace-gym model init` and `trace-gym sft` (wired into the `trace-gym` command by trace_gym.cli)."""

from __future__ import annotations

import argparse
import json

from trace_gym.errors import ConfigError


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """Add the options of `command` ("model" or "sft") to `parser` (every option has a help text: the
    dispatcher's formatter appends its default)."""
    if command == "model":
        parser.add_argument("action", choices=["init"], help="init: build the tiny model from config")
        parser.add_argument("--out", required=True, help="model folder to write")
        parser.add_argument("--size", choices=["nano", "tiny"], default="tiny", help="nano ~0.2M, tiny ~0.8M")
        parser.add_argument("--seed", type=int, default=0, help="seed of the initial weights")
    elif command == "sft":
        from trace_gym.agents.sft import SFTConfig

        d = SFTConfig()
        parser.add_argument("--model", required=True, help="model folder to fine-tune (trace-gym model init)")
        parser.add_argument("--env", default="trace/Arithmetic-v0",
                            help="env whose scripted expert teaches: an id, module:id or module:Class")
        parser.add_argument("--episodes", type=int, default=2000, help="expert episodes to collect")
        parser.add_argument("--out", default=None, help="output folder (default: the model folder, in place)")
        parser.add_argument("--steps", type=int, default=d.steps, help="optimiser steps")
        parser.add_argument("--batch-size", type=int, default=d.batch_size, help="episodes per step")
        parser.add_argument("--lr", type=float, default=d.lr, help="peak AdamW learning rate")
        parser.add_argument("--seed", type=int, default=d.seed, help="seed of batch sampling")
        parser.add_argument("--noise", type=float, default=0.0, help="expert noise (failed episodes are dropped)")
        parser.add_argument("--eval-episodes", type=int, default=100, help="held-out tasks to evaluate on")
        parser.add_argument("--env-kwargs", default="{}", help="JSON keyword arguments of the env")


def run(command: str, args: argparse.Namespace) -> int:
    """Run `command`; returns the exit status."""
    if command == "model":
        from trace_gym.agents.tiny import build_tiny_model

        out = build_tiny_model(args.out, size=args.size, seed=args.seed)
        print((out / "trace_gym_model.json").read_text().strip(), "->", out)
        return 0
    from trace_gym.agents.sft import SFTConfig, sft_env
    from trace_gym.agents.specs import check_model_folder
    from trace_gym.env_specs import resolve_env_spec

    check_model_folder(args.model)
    resolve_env_spec(args.env)
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"expected --env-kwargs as a JSON object, got {args.env_kwargs!r} ({exc.msg}); fix: "
                          """e.g. --env-kwargs '{"n_tasks": 500}'""") from None
    if not isinstance(env_kwargs, dict):
        raise ConfigError(f"expected --env-kwargs as a JSON object, got {args.env_kwargs!r}; fix: e.g. "
                          """--env-kwargs '{"n_tasks": 500}'""")
    config = SFTConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    summary = sft_env(args.model, args.env, episodes=args.episodes, out_dir=args.out, config=config,
                      eval_episodes=args.eval_episodes, noise=args.noise, env_kwargs=env_kwargs)
    print(json.dumps(summary, indent=2))
    return 0
