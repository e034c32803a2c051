"""`trace-gym model init` (wired into the `trace-gym` command by trace_gym.training.cli.main; `trace-gym sft` lives in
trace_gym.training.driver.warm_start, which collects its expert episodes through the rollout collector)."""

from __future__ import annotations

import argparse


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    if command == "model":
        parser.add_argument("action", choices=["init"], help="init: build the tiny model from config")
        parser.add_argument("--out", required=True, help="model folder to write")
        parser.add_argument("--size", choices=["nano", "tiny"], default="tiny", help="nano ~0.2M, tiny ~0.8M")
        parser.add_argument("--seed", type=int, default=0)


def run(command: str, args: argparse.Namespace) -> int:
    from trace_gym.agents.tiny import build_tiny_model

    out = build_tiny_model(args.out, size=args.size, seed=args.seed)
    print((out / "trace_gym_model.json").read_text().strip(), "->", out)
    return 0
