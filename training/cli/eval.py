"""``trace-gym eval``: a run's model, or any policy on any env, on held-out tasks (the dispatcher in
training/cli/main.py calls `add_arguments` and `run`).

    trace-gym eval  --checkpoint RUN_DIR|CKPT_DIR [--config FILE] [key=value ...]
    trace-gym eval  --config configs/quickstart.yaml [key=value ...]
    trace-gym eval  --env SPEC [--env-arg KEY=VALUE ...] --policy SPEC [options]     (any policy: cli/play.py)

`eval --checkpoint` reads the run folder's own config.yaml when --config is absent; its sampling flags
(--tasks, --samples, ...) are overrides of that config. Every form reports through `play.report`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from trace_gym.errors import ConfigError
from trace_gym.training.cli import play
from trace_gym.training.config import TrainConfig, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (configs/*.yaml) whose model to evaluate; with --checkpoint, "
                                         "defaults to the run's own")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides parsed as YAML, e.g. optim.lr=1e-4 alloc.allocator=grpo")
    parser.add_argument("--checkpoint", metavar="DIR",
                        help="evaluate this run's last checkpoint (RUN_DIR) or one checkpoint folder")
    play.add_arguments("eval", parser)


def _config(args: argparse.Namespace) -> TrainConfig:
    path = args.config
    if path is None and args.checkpoint is not None:
        path = str(_run_config_of(args.checkpoint))
    if path is None:
        raise ConfigError("expected what to evaluate (--checkpoint RUN_DIR, --config FILE, or --env SPEC with "
                          "--policy SPEC), got none; fix: trace-gym eval --checkpoint RUN_DIR (its own config), "
                          "trace-gym eval --config configs/quickstart.yaml, or any policy on an env: trace-gym eval "
                          "--env trace/Arithmetic-v0 --policy expert")
    return load_config(path, list(args.overrides or []))


def _run_config_of(checkpoint: str) -> Path:
    """The config.yaml of the run that `checkpoint` (RUN_DIR or RUN_DIR/checkpoints/step_N) belongs to."""
    ckpt = Path(checkpoint)
    for folder in (ckpt, ckpt.parent.parent):
        if (folder / "config.yaml").is_file():
            return folder / "config.yaml"
    raise ConfigError(f"expected --checkpoint to be a run folder or one of its checkpoints (with the run's "
                      f"config.yaml), got {checkpoint!r}; fix: trace-gym eval --checkpoint runs/quickstart/rl, or "
                      "add --config FILE")


def run(args: argparse.Namespace) -> int:
    """Evaluate; returns the process exit code."""
    from rich.console import Console

    from trace_gym.training.cli.train import check_env

    console = Console()
    if args.env is not None or args.policy is not None:
        return _eval_policy(args, console)
    args.overrides = [*(args.overrides or []), *play.config_overrides(args)]
    cfg = _config(args)
    check_env(cfg)
    return _eval(cfg, args, console)


def _eval(cfg: TrainConfig, args: argparse.Namespace, console: Any) -> int:
    import time

    from trace_gym.training.driver.evaluation import evaluate_config, evaluated_model

    out = play.check_out(args.out, "eval", args.trees)
    model = evaluated_model(cfg, args.checkpoint)
    env, env_args = cfg.env.id, {**cfg.env.kwargs, **cfg.env.eval_kwargs}
    if cfg.env.mix:  # several envs: each by its key
        env = ", ".join(f"{e.key_name}={e.id}" for e in cfg.env.mix)
        env_args = {e.key_name: {**e.kwargs, **e.eval_kwargs} for e in cfg.env.mix}
    about = {"command": "eval", "env": env, "env_args": env_args,
             "policy": str(model), "model": str(model), "samples": cfg.eval.samples, "branches": 0,
             "temperature": cfg.eval.temperature, "max_new_tokens": cfg.rollout.max_new_tokens, "seed": cfg.seed}
    rows = play.open_rows(out, "eval", args.trees, {**about, "tasks": cfg.eval.tasks,
                                                    "max_context": cfg.rollout.max_context}, args.resume)
    start = time.perf_counter()
    with play.progress_bar(console, enabled=not args.json, label="eval") as progress:
        result = play.guarded("eval", rows, lambda: evaluate_config(cfg, args.checkpoint, keep_trees=args.trees,
                                                                    progress=progress, rows=rows))
    if result is None:
        return 130
    play.report(result, about, time.perf_counter() - start, out, console, args.json, streamed=rows is not None)
    return 0


def _eval_policy(args: argparse.Namespace, console: Any) -> int:
    """`eval --env ... --policy ...`: neither a config nor its overrides apply."""
    given = "--checkpoint" if args.checkpoint else "--config" if args.config else args.overrides[0] \
        if args.overrides else None
    if given is not None:
        raise ConfigError(f"expected either a run (--checkpoint/--config [key=value ...]) or a policy on an env "
                          f"(--env, --policy), got both ({given}); fix: drop {given}"
                          + (", and set the env's arguments with --env-arg KEY=VALUE" if "=" in given else ""))
    return play.run("eval", args, console)


