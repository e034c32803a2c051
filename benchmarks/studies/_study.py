"""Shared pieces of the learning and predictor studies (docs/learning.md): warm starts, held-out sets, paired
evaluation, and Trainer construction on the tiny model.

Two held-out measures, both per prompt so that comparisons are paired over the same prompts:
- sampled success: k episodes per prompt at T = 1 with a fresh sampling seed per evaluation;
- expert probability: P(the scripted expert's trajectory) under the policy at T = 1, by teacher forcing (no
  sampling, so no sampling noise). On Arithmetic the expert's trajectory is the one correct format the warm
  start imitates, so it is a lower bound on success that tracks it (checked in docs/learning.md).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import BENCH_RUNS, COPYING, mean_ci, warm_model  # noqa: E402
from _common import train_config as bench_config  # noqa: E402

from trace_gym.training.rollout.evaluate import (  # noqa: E402
    expert_logprob,
    expert_sequences,
)

STUDY_RUNS = ROOT / "runs" / "studies"
ENV = "trace/Arithmetic-v0"


def arith_kwargs(difficulty: int | None = None, n_tasks: int = 2000, task_seed: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"n_tasks": n_tasks, "task_seed": task_seed, "word_fraction": 0.0}
    if difficulty is not None:
        out["difficulty"] = difficulty
    return out


def env_factory(kwargs: dict[str, Any]) -> Callable[[], Any]:
    from trace_gym.env_specs import env_factory as factory

    return factory(ENV, kwargs)


def tasks_of(make_env: Callable[[], Any], n: int | None = None) -> list[Any]:
    from trace_gym.env_specs import env_tasks

    tasks = env_tasks(make_env)
    return tasks if n is None else tasks[:n]


def warm_start(sft_steps: int = 400) -> str:
    """The tiny model SFT'd on Arithmetic (level-3 mix) for ``sft_steps`` steps; cached under runs/bench."""
    other = [] if sft_steps == 400 else [f"sft.steps={sft_steps}",
                                         f"sft.output={BENCH_RUNS / 'arithmetic'}/model-sft{sft_steps}"]
    return warm_model(ENV, overrides=other, config=COPYING)


def train_config(env_id: str, run_dir: Path, overrides: Sequence[str] = ()) -> Any:
    """The studies' setting: configs/quickstart_copying.yaml pointed at ``env_id`` (see benchmarks/_common.py)."""
    return bench_config(env_id, run_dir, overrides, COPYING)


def load(model_path: str) -> tuple[torch.nn.Module, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    return model, tok


def sampled_success(model: torch.nn.Module, tokenizer: Any, make_env: Callable[[], Any], tasks: Sequence[Any],
                    samples: int, seed: int, max_new_tokens: int = 48, max_context: int = 1024,
                    temperature: float = 1.0) -> np.ndarray:
    """(n_tasks,) share of `samples` episodes at ``temperature`` that succeed, per prompt, in the order of
    ``tasks`` (`evaluate.evaluate_policy`)."""
    from trace_gym.agents.hf import HFPolicy
    from trace_gym.agents.policy import SamplingParams
    from trace_gym.training.rollout.evaluate import evaluate_policy

    policy = HFPolicy(model, tokenizer, max_batch_size=64)
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    was = model.training
    model.eval()
    result = evaluate_policy(policy, make_env, list(tasks), samples, sampling, seed, max_context=max_context)
    model.train(was)
    by_id = {o.task_id: o.success for o in result.tasks}
    return np.array([by_id[t.id] for t in tasks], dtype=np.float64)


def paired(before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    """after - before over the same prompts (`evaluate.PairedDifference`: mean, 95% interval, prompts)."""
    from trace_gym.training.stats import PairedDifference

    d = np.asarray(after, np.float64) - np.asarray(before, np.float64)
    return dataclasses.asdict(PairedDifference.of(d.tolist()))


def fmt(s: dict[str, float], digits: int = 3) -> str:
    return f"{s['mean']:+.{digits}f} [{s['lo']:+.{digits}f}, {s['hi']:+.{digits}f}]"


def log_run(path: Path, row: dict[str, Any]) -> None:
    """Append one result row (JSON) to a study log."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), **row}) + "\n")


def trainer(run_dir: Path, model_path: str, overrides: Sequence[str]) -> Any:
    """Today's Trainer on Arithmetic from ``model_path``, no built-in eval (the studies evaluate paired)."""
    from trace_gym.training.driver.trainer import Trainer

    cfg = train_config(ENV, run_dir, [f"model.path={model_path}", "sft.enabled=false", "eval.tasks=0",
                                      "checkpoint.every=0", "log.plots=false", "env.workers=2", *overrides])
    return Trainer(cfg)


__all__ = ["BENCH_RUNS", "STUDY_RUNS", "expert_logprob", "expert_sequences", "mean_ci", "train_config"]
