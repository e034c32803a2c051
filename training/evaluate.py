"""Held-out evaluation: mean success over k samples per prompt of an env's evaluation split."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from trace_gym.errors import ConfigError

from .config import TrainConfig


def evaluate_policy(policy: Any, make_env: Callable[[], gym.Env], tasks: Sequence[Any], samples: int,
                    temperature: float, max_new_tokens: int, seed: int, tokenizer: Any = None,
                    max_context: int = 4096) -> dict[str, float]:
    """`eval/success` (mean reward > 0), `eval/episodes`, `eval/turns` for `samples` episodes per task."""
    import numpy as np

    from trace_gym.agents.policy import SamplingParams
    from trace_gym.agents.rollout import play_episodes, success_rate

    resets = [{"options": {"task": t}} for t in tasks for _ in range(samples)]
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    episodes = play_episodes(policy, make_env, resets, sampling, tokenizer=tokenizer, max_context=max_context,
                             parallel=64)
    return {"eval/success": success_rate(episodes), "eval/episodes": float(len(episodes)),
            "eval/turns": float(np.mean([e.turns for e in episodes])) if episodes else 0.0}


def evaluate_config(cfg: TrainConfig, checkpoint: str | Path | None = None) -> dict[str, Any]:
    """Evaluate the config's model (the SFT output when SFT is enabled) or a checkpoint's on the held-out split."""
    import torch

    from trace_gym.agents.hf import HFPolicy

    from .checkpoint import latest_checkpoint
    from .trainer import dataset_of, make_env_factory, resolve_device

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
    make_env = make_env_factory(cfg.env.id, {**cfg.env.kwargs, **cfg.env.eval_kwargs})
    tasks = dataset_of(make_env)[:cfg.eval.tasks]
    policy = HFPolicy.from_pretrained(model_path, device=resolve_device(cfg.model.device), dtype=torch.float32)
    out = evaluate_policy(policy, make_env, tasks, cfg.eval.samples, cfg.eval.temperature,
                          cfg.rollout.max_new_tokens, cfg.seed, policy.tokenizer, cfg.rollout.max_context)
    return {"env": cfg.env.id, "model": str(model_path), "tasks": len(tasks), "samples": cfg.eval.samples,
            "success": out["eval/success"], "episodes": int(out["eval/episodes"])}
