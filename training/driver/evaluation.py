"""Evaluating a config's model: the model folder a run's config (or checkpoint) names, played on the held-out
prompts (`evaluate.held_out_tasks` of the env with ``env.eval_kwargs``) as the config's ``eval`` section asks;
the evaluation itself is `training/rollout/evaluate.py`'s, as for every other command."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trace_gym.agents.policy import SamplingParams
from trace_gym.errors import ConfigError
from trace_gym.training.config import TrainConfig
from trace_gym.training.driver.checkpoint import latest_checkpoint
from trace_gym.training.rollout.evaluate import HELD_OUT, EvalResult, RowsFile, evaluate_policy, held_out_tasks


def evaluate_config(cfg: TrainConfig, checkpoint: str | Path | None = None, seed: int | None = None,
                    keep_trees: bool = False, progress: Callable[[int, int], None] | None = None,
                    rows: RowsFile | None = None) -> EvalResult:
    """Evaluate the config's model (the SFT output when SFT is enabled) or a checkpoint's on the held-out split
    (`cfg.eval`: tasks, samples, temperature); ``seed`` defaults to the config's; ``progress`` as in
    `evaluate_policy`; ``rows`` hears each episode as it ends (and gives the kept ones of a resumed run)."""
    import torch

    from trace_gym.agents.hf import HFPolicy
    from trace_gym.env_specs import EnvFactory, env_factory
    from trace_gym.training.driver import mix
    from trace_gym.training.driver.builders import resolve_device  # torch

    model_path = evaluated_model(cfg, checkpoint)
    if cfg.env.mix:  # several envs: each env's first eval.tasks held-out prompts (all with 0), as the trainer's
        mixed = mix.make_mix(cfg.env, evaluation=True)
        tasks = [t for ts in mixed.tasks().values() for t in (ts[:cfg.eval.tasks] if cfg.eval.tasks else ts)]
        make_env: mix.EnvMix | EnvFactory = mixed
    else:
        make_env = env_factory(cfg.env.id, {**cfg.env.kwargs, **cfg.env.eval_kwargs})
        tasks = held_out_tasks(make_env, cfg.eval.tasks)
    policy = HFPolicy.from_pretrained(model_path, device=resolve_device(cfg.model.device), dtype=torch.float32)
    sampling = SamplingParams(temperature=cfg.eval.temperature, max_new_tokens=cfg.rollout.max_new_tokens)
    return evaluate_policy(policy, make_env, tasks, cfg.eval.samples, sampling, cfg.seed if seed is None else seed,
                           keep_trees, cfg.env.workers, cfg.rollout.max_context, progress=progress,
                           kept=rows.kept if rows else (), on_episode=rows.episode if rows else None,
                           breaker=HELD_OUT.breaker, on_tree=rows.tree if rows else None)


def evaluated_model(cfg: TrainConfig, checkpoint: str | Path | None = None) -> Path:
    """The model folder `evaluate_config` loads: a checkpoint's (a run folder's latest), else the SFT output
    when SFT is enabled, else ``model.path``."""
    if checkpoint is not None:
        ckpt = Path(checkpoint)
        found = ckpt if (ckpt / "model").is_dir() else latest_checkpoint(ckpt)
        if found is None:
            raise ConfigError(f"expected a run folder or checkpoint folder, got {str(checkpoint)!r}; "
                              "fix: pass RUN_DIR or RUN_DIR/checkpoints/step_N")
        model_path = found / "model"
    else:
        model_path = Path(cfg.sft.output if cfg.sft.enabled else cfg.model.path)
    if not (model_path / "config.json").is_file():
        raise ConfigError(f"expected a model folder at {str(model_path)!r}, got none; fix: train first or pass "
                          "--checkpoint")
    return model_path
