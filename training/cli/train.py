"""``trace-gym train``: a training run from a YAML config (the dispatcher in training/cli/main.py calls
`add_arguments` and `run`).

    trace-gym train --config configs/quickstart.yaml [key=value ...] [--resume RUN_DIR]
    torchrun --standalone --nproc-per-node 2 -m trace_gym.training.cli train --config ... model.strategy=ddp
    trace-gym train --config ... model.strategy=fsdp --ray-ranks 8 --gpus-per-rank 1     (ranks on Ray)

Resuming a run that already reached its `steps` says so and exits 0 (raise `steps=` to train on).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_gym.errors import ConfigError
from trace_gym.training.config import TrainConfig, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (configs/*.yaml); with --resume, defaults to the run's own")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides parsed as YAML, e.g. optim.lr=1e-4 alloc.allocator=grpo")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    parser.add_argument("--ray-ranks", type=int, default=0, metavar="N",
                        help="run the data-parallel update (model.strategy ddp|fsdp) on N Ray actors")
    parser.add_argument("--gpus-per-rank", type=float, default=0.0, help="GPUs per Ray rank (with --ray-ranks)")


def _config(args: argparse.Namespace) -> TrainConfig:
    path = args.config
    if path is None and args.resume is not None:
        path = str(_run_folder(args.resume) / "config.yaml")
    if path is None:
        raise ConfigError("expected --config FILE, got none; fix: trace-gym train --config configs/quickstart.yaml")
    overrides = list(args.overrides or [])
    if args.resume is not None and not any(o.startswith("run_dir=") for o in overrides):
        overrides.append(f"run_dir={args.resume}")
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


def _finished(cfg: TrainConfig, resume: str | None) -> int | None:
    """The step a resumed run already reached, when that is all of its `steps` (None otherwise)."""
    if resume is None:
        return None
    steps = [int(p.parent.name.removeprefix("step_")) for p in (Path(resume) / "checkpoints").glob("step_*/state.pt")]
    return max(steps) if steps and max(steps) >= cfg.steps else None


def check_env(cfg: TrainConfig) -> None:
    """Resolve the env and load its training and held-out tasks now: a wrong id or data file then fails in a
    second, before a warm start that can take minutes."""
    from trace_gym.env_specs import env_factory

    envs = [(e.id, e.kwargs, e.eval_kwargs) for e in cfg.env.mix] or [(cfg.env.id, cfg.env.kwargs,
                                                                       cfg.env.eval_kwargs)]
    for spec, kwargs in ((s, k) for s, train, held in envs for k in (train, {**train, **held})):
        factory = env_factory(spec, kwargs)
        if not factory.tasks():  # loads (and checks) the data; an env that is no TextEnv has none
            name = factory.env_class.__name__ if factory.env_class is not None else spec
            raise ConfigError(f"expected env.id to name a trace_gym TextEnv (training and evaluation draw "
                              f"prompts from its tasks), got {name}; fix: subclass trace_gym.ToolEnv, as the "
                              "README's CapitalsEnv does")


def run(args: argparse.Namespace) -> int:
    """Train; returns the process exit code."""
    from rich.console import Console

    console = Console()
    cfg = _config(args)
    if (done := _finished(cfg, args.resume)) is not None:
        console.print(f"{args.resume} is complete: {done} of {cfg.steps} steps (results in "
                      f"{Path(args.resume) / 'summary.json'}); to train on, raise steps: "
                      f"trace-gym train --resume {args.resume} steps={cfg.steps + done}")
        return 0
    check_env(cfg)
    if args.ray_ranks:
        from trace_gym.training.driver.launch import ray_train

        print_summary(ray_train(cfg, args.ray_ranks, args.resume, gpus_per_rank=args.gpus_per_rank), console)
        return 0
    return _train(cfg, args.resume, console)


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
