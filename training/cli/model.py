"""``trace-gym model init``: build the embedded tiny model (`trace_gym.agents.tiny.build_tiny_model`)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["init"], help="init: build the tiny model from config")
    parser.add_argument("--out", required=True, help="model folder to write")
    parser.add_argument("--size", choices=["nano", "tiny"], default="tiny", help="nano ~0.2M, tiny ~0.8M")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from trace_gym.agents.tiny import build_tiny_model

    out = build_tiny_model(args.out, size=args.size, seed=args.seed)
    print((out / "trace_gym_model.json").read_text().strip(), "->", out)
    return 0
