"""`trace-gym train` and `trace-gym eval` (the dispatcher in training/cli/main.py calls these two functions).

    trace-gym train --config configs/quickstart.yaml [key=value ...] [--resume RUN_DIR]
    torchrun --standalone --nproc-per-node 2 -m trace_gym.training.cli train --config ... model.strategy=ddp
    trace-gym train --config ... model.strategy=fsdp --ray-ranks 8 --gpus-per-rank 1     (ranks on Ray)
    trace-gym eval  --checkpoint RUN_DIR|CKPT_DIR [--config FILE] [key=value ...]
    trace-gym eval  --config configs/quickstart.yaml [key=value ...]
    trace-gym eval  --env SPEC [--env-arg KEY=VALUE ...] --policy SPEC [options]     (any policy: cli/play.py)

`eval --checkpoint` reads the run folder's own config.yaml when --config is absent; its sampling flags
(--tasks, --samples, ...) are overrides of that config. Every form reports through `policy_cli.report`. Resuming
a run that already reached its `steps` says so and exits 0 (raise `steps=` to train on).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_gym.errors import ConfigError
from trace_gym.training.config import TrainConfig, load_config


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """Add the options of `command` ("train" or "eval") to `parser`."""
    if command not in ("train", "eval"):
        raise ConfigError(f"expected command 'train' or 'eval', got {command!r}")
    parser.add_argument("--config", help="YAML config (configs/*.yaml); with --resume, defaults to the run's own"
                        if command == "train" else "YAML config (configs/*.yaml) whose model to evaluate; with "
                        "--checkpoint, defaults to the run's own")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides parsed as YAML, e.g. optim.lr=1e-4 alloc.allocator=grpo")
    if command == "train":
        parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
        parser.add_argument("--ray-ranks", type=int, default=0, metavar="N",
                            help="run the data-parallel update (model.strategy ddp|fsdp) on N Ray actors")
        parser.add_argument("--gpus-per-rank", type=float, default=0.0, help="GPUs per Ray rank (with --ray-ranks)")
    else:
        from trace_gym.training.cli import play as policy_cli

        parser.add_argument("--checkpoint", metavar="DIR",
                            help="evaluate this run's last checkpoint (RUN_DIR) or one checkpoint folder")
        policy_cli.add_arguments("eval", parser)


def _config(command: str, args: argparse.Namespace) -> TrainConfig:
    path = args.config
    resume = getattr(args, "resume", None)
    if path is None and resume is not None:
        path = str(_run_folder(resume) / "config.yaml")
    checkpoint = getattr(args, "checkpoint", None)
    if path is None and checkpoint is not None:
        path = str(_run_config_of(checkpoint))
    if path is None:
        fix = "trace-gym train --config configs/quickstart.yaml" if command == "train" else \
            "trace-gym eval --checkpoint RUN_DIR (its own config), trace-gym eval --config configs/quickstart.yaml, " \
            "or any policy on an env: trace-gym eval --env trace/Arithmetic-v0 --policy expert"
        what = "--config FILE" if command == "train" else \
            "what to evaluate (--checkpoint RUN_DIR, --config FILE, or --env SPEC with --policy SPEC)"
        raise ConfigError(f"expected {what}, got none; fix: {fix}")
    overrides = list(args.overrides or [])
    if resume is not None and not any(o.startswith("run_dir=") for o in overrides):
        overrides.append(f"run_dir={resume}")
    return load_config(path, overrides)


def _run_folder(resume: str) -> Path:
    """`resume` when it is a run folder (config.yaml and a checkpoint), else a ConfigError saying what it lacks."""
    run = Path(resume)
    start = "trace-gym train --config configs/quickstart.yaml"
    if not (run / "config.yaml").is_file():
        what = "no such folder" if not run.exists() else "no config.yaml: not a run folder"
        raise ConfigError(f"expected a run folder to resume (config.yaml, checkpoints/), got {resume!r} ({what}); "
                          f"fix: pass the run_dir of an earlier run (e.g. runs/quickstart/rl) or start one: {start}")
    if not any((run / "checkpoints").glob("step_*/state.pt")):
        raise ConfigError(f"expected a run with a checkpoint to resume, got {resume!r} (it saved none); fix: start "
                          f"it again: trace-gym train --config {run / 'config.yaml'}")
    return run


def _run_config_of(checkpoint: str) -> Path:
    """The config.yaml of the run that `checkpoint` (RUN_DIR or RUN_DIR/checkpoints/step_N) belongs to."""
    ckpt = Path(checkpoint)
    for folder in (ckpt, ckpt.parent.parent):
        if (folder / "config.yaml").is_file():
            return folder / "config.yaml"
    raise ConfigError(f"expected --checkpoint to be a run folder or one of its checkpoints (with the run's "
                      f"config.yaml), got {checkpoint!r}; fix: trace-gym eval --checkpoint runs/quickstart/rl, or "
                      "add --config FILE")


def _finished(cfg: TrainConfig, resume: str | None) -> int | None:
    """The step a resumed run already reached, when that is all of its `steps` (None otherwise)."""
    if resume is None:
        return None
    steps = [int(p.parent.name.removeprefix("step_")) for p in (Path(resume) / "checkpoints").glob("step_*/state.pt")]
    return max(steps) if steps and max(steps) >= cfg.steps else None


def _check_env(cfg: TrainConfig) -> None:
    """Resolve the env and load its training and held-out tasks now: a wrong id or data file then fails in a
    second, before a warm start that can take minutes."""
    from trace_gym.env_specs import env_factory

    for kwargs in (cfg.env.kwargs, {**cfg.env.kwargs, **cfg.env.eval_kwargs}):
        factory = env_factory(cfg.env.id, kwargs)
        if not factory.tasks():  # loads (and checks) the data; an env that is no TextEnv has none
            name = factory.env_class.__name__ if factory.env_class is not None else cfg.env.id
            raise ConfigError(f"expected env.id to name a trace_gym TextEnv (training and evaluation draw "
                              f"prompts from its tasks), got {name}; fix: subclass trace_gym.ToolEnv, as the "
                              "README's CapitalsEnv does")


def run(command: str, args: argparse.Namespace) -> int:
    """Run `command`; returns the process exit code."""
    from rich.console import Console

    console = Console()
    if command == "eval" and (args.env is not None or args.policy is not None):
        return _eval_policy(args, console)
    if command == "eval":
        from trace_gym.training.cli.play import config_overrides

        args.overrides = [*(args.overrides or []), *config_overrides(args)]
    cfg = _config(command, args)
    if command == "train" and (done := _finished(cfg, args.resume)) is not None:
        console.print(f"{args.resume} is complete: {done} of {cfg.steps} steps (results in "
                      f"{Path(args.resume) / 'summary.json'}); to train on, raise steps: "
                      f"trace-gym train --resume {args.resume} steps={cfg.steps + done}")
        return 0
    _check_env(cfg)
    if command == "train" and args.ray_ranks:
        from trace_gym.training.driver.launch import ray_train

        print_summary(ray_train(cfg, args.ray_ranks, args.resume, gpus_per_rank=args.gpus_per_rank), console)
        return 0
    if command == "train":
        return _train(cfg, args.resume, console)
    if command == "eval":
        return _eval(cfg, args, console)
    raise ConfigError(f"expected command 'train' or 'eval', got {command!r}")


def _train(cfg: TrainConfig, resume: str | None, console: Any) -> int:
    from trace_gym.training.driver.trainer import Trainer

    trainer = Trainer(cfg, resume=resume, console=console if cfg.log.progress else None)
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    if trainer.lead:  # under torchrun the other ranks only followed the update
        print_summary(summary, console)
    return 0


def _eval(cfg: TrainConfig, args: argparse.Namespace, console: Any) -> int:
    import time

    from trace_gym.training.cli.play import check_out, progress_bar, report
    from trace_gym.training.driver.evaluation import evaluate_config, evaluated_model

    out = check_out(args.out, "eval", args.trees)
    model = evaluated_model(cfg, args.checkpoint)
    start = time.perf_counter()
    with progress_bar(console, enabled=not args.json, label="eval") as progress:
        result = evaluate_config(cfg, args.checkpoint, keep_trees=args.trees, progress=progress)
    about = {"command": "eval", "env": cfg.env.id, "env_args": {**cfg.env.kwargs, **cfg.env.eval_kwargs},
             "policy": str(model), "model": str(model), "samples": cfg.eval.samples, "branches": 0,
             "temperature": cfg.eval.temperature, "max_new_tokens": cfg.rollout.max_new_tokens, "seed": cfg.seed}
    report(result, about, time.perf_counter() - start, out, console, args.json)
    return 0


def _eval_policy(args: argparse.Namespace, console: Any) -> int:
    """`eval --env ... --policy ...`: neither a config nor its overrides apply."""
    from trace_gym.training.cli import play as policy_cli

    given = "--checkpoint" if args.checkpoint else "--config" if args.config else args.overrides[0] \
        if args.overrides else None
    if given is not None:
        raise ConfigError(f"expected either a run (--checkpoint/--config [key=value ...]) or a policy on an env "
                          f"(--env, --policy), got both ({given}); fix: drop {given}"
                          + (", and set the env's arguments with --env-arg KEY=VALUE" if "=" in given else ""))
    return policy_cli.run("eval", args, console)


_GAIN_NAMES = {"success": "success", "expert": "expert-probability", "tool_use": "tool-use"}


def _with_interval(success: float | None, interval: Sequence[float] | None) -> float | str | None:
    """``0.600 [0.313, 0.832]``: a held-out success with its Wilson interval over prompts, when the run has it."""
    if success is None or not interval:
        return success
    return f"{success:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"


def print_summary(summary: dict[str, Any], console: Any) -> None:
    """The final table of a training run."""
    from rich.table import Table

    def fmt(x: Any) -> str:
        return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)

    table = Table(title=f"trace-gym train: {summary['run_dir']}",
                  caption="held-out figures are sampled draws (eval.temperature); trace-gym eval --checkpoint "
                          "draws again with its own seed, within these intervals")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("allocator", summary["allocator"]), ("steps", summary["steps"]),
        ("held-out success before (95% interval)", _with_interval(summary["success_before"],
                                                                  summary.get("success_before_ci95"))),
        ("held-out success after (95% interval)", _with_interval(summary["success_after"],
                                                                 summary.get("success_after_ci95"))),
        ("held-out tool use before", summary.get("tool_use_before")),
        ("held-out tool use after", summary.get("tool_use_after")),
        *((f"held-out {_GAIN_NAMES[k]} gain (paired, 95%, {g['tasks']} prompts)",
           f"{g['mean']:+.3f} [{g['lo']:+.3f}, {g['hi']:+.3f}]") for k, g in summary.get("gain", {}).items()),
        ("effective ratio (first step)", summary["effective_ratio_first"]),
        ("effective ratio (last step)", summary["effective_ratio_last"]),
        ("effective ratio (mean)", summary["effective_ratio_mean"]),
        ("budget: trajectories / step", summary["trajectories_per_step"]),
        ("budget: trajectories, total", summary["trajectories"]),
        ("generated tokens", summary["generated_tokens"]),
        # The warm start (SFT) runs before RL in the same command: its time is shown, and counted in the total.
        ("wall time: warm start, SFT (s)", summary.get("warm_start_s")), ("wall time: RL (s)", summary["wall_s"]),
        ("wall time: total (s)", None if summary.get("warm_start_s") is None else
         summary["wall_s"] + summary["warm_start_s"]),
    ]
    for name, value in rows:
        table.add_row(name, fmt(value))
    console.print(table)
