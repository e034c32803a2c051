"""The trainer: what lives across steps (model, optimiser, predictor, data position) and the training loop.

A step is `training.step.take_step` (allocate roots -> bare rollouts -> plan and run continuations -> fit the
predictor -> samples -> annotations -> `Learner.update`) over the run's collector, then the weight sync and
the logs. The parts are built from the config in `builders.py`; the warm start is `warm_start.py`;
evaluation is `rollout/evaluate.py`.

Choices where the paper is silent:
1. Each step draws `pool_size` candidate prompts in a seeded per-epoch shuffled order; prompts the allocator
   leaves out are not revisited this epoch (the data position advances by the pool).
2. All randomness of a step (sampling seeds, uniform allocators, mini-batch order, evaluation samples) derives
   from (seed, step), so a resumed run repeats an uninterrupted one exactly on the CPU.
3. With `distributed: ray` each rollout worker builds its own policy from the model folder
   (`builders.worker_policy`) and receives the trained weights in the sync stage of every step; evaluation
   stays in this process.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trace_gym import threads
from trace_gym.agents.policy import SamplingParams
from trace_gym.env_specs import env_factory, env_tasks
from trace_gym.errors import ConfigError
from trace_gym.progress import Progress
from trace_gym.seeds import derive, generator
from trace_gym.tasks import Task
from trace_gym.training.allocation.allocators import make_allocator
from trace_gym.training.config import TrainConfig, dump_config
from trace_gym.training.driver import mix
from trace_gym.training.driver.builders import (
    hidden_state_fn,
    make_collector,
    make_policy,
    make_predictor,
    resolve_device,
    worker_policy,
)
from trace_gym.training.driver.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from trace_gym.training.driver.history import RunHistory
from trace_gym.training.driver.metrics_log import MetricsLogger
from trace_gym.training.driver.progress import StepProgress, plot_at_end
from trace_gym.training.driver.warm_start import warm_start
from trace_gym.training.rollout.evaluate import eval_collector, evaluate, expert_logprob, expert_sequences
from trace_gym.training.stats import PairedDifference, wilson_interval
from trace_gym.training.step import StageTimer, StepResult, Update, take_step
from trace_gym.training.update.learner import Learner
from trace_gym.training.update.parallel import broadcast_object, join_process_group


class TaskStream:
    """Training prompts in a seeded shuffled order per epoch; `position` is all the state there is."""

    def __init__(self, tasks: Sequence[Task], seed: int, position: int = 0):
        if not tasks:
            raise ConfigError("expected a non-empty training set, got none; fix: check env.kwargs")
        self.tasks, self.seed, self.position = list(tasks), seed, position
        self._epoch, self._order = -1, np.zeros(0, dtype=np.int64)

    def take(self, n: int) -> list[Task]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.tasks))
            if epoch != self._epoch:
                self._epoch, self._order = epoch, generator(self.seed, epoch).permutation(len(self.tasks))
            out.append(self.tasks[int(self._order[i])])
            self.position += 1
        return out


class Trainer:
    """Holds what lives across steps; `step()` runs the stages once, `train()` runs the loop."""

    def __init__(self, cfg: TrainConfig, resume: str | Path | None = None, console: Any = None):
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # weight loading/saving bars would break the step progress bar
        self.cfg, self.console = cfg, console
        self.run_dir = Path(cfg.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.device = resolve_device(cfg.model.device)
        torch.manual_seed(cfg.seed)
        self.mix = mix.make_mix(cfg.env) if cfg.env.mix else None  # several envs: training/driver/mix.py
        self.make_env = self.mix or env_factory(cfg.env.id, cfg.env.kwargs)
        self.make_eval_env = (mix.make_mix(cfg.env, evaluation=True) if cfg.env.mix else
                              env_factory(cfg.env.id, {**cfg.env.kwargs, **cfg.env.eval_kwargs}))
        rank, _ = join_process_group(cfg.model.strategy)
        self.lead = rank == 0  # rank 0 runs the step; other ranks only join the update (training/update/learner.py)
        state, model_path = None, None
        self.warm_start_s: float | None = None
        """Seconds this run spent on its warm start (building the model, SFT); None when it resumed."""
        if self.lead:
            ckpt = latest_checkpoint(resume) if resume is not None else None
            if resume is not None and ckpt is None:
                raise ConfigError(f"expected a run folder with checkpoints to resume, got {str(resume)!r}; "
                                  "fix: pass the run_dir of a run that saved a checkpoint")
            if ckpt is not None:
                state = load_checkpoint(ckpt)
                model_path = str(ckpt / "model")
            else:
                started = time.perf_counter()
                model_path = warm_start(cfg, self.make_env, console)
                self.warm_start_s = time.perf_counter() - started
        model_path, optimizer_state = broadcast_object((model_path, state and state["optimizer"]))
        self.model_path = model_path
        self.sampling = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                       max_new_tokens=cfg.rollout.max_new_tokens)
        self.learner = Learner(cfg.model, cfg.optim, model_path, self.device, seed=cfg.seed,
                               temperature=self.sampling.logprob_temperature, optimizer_state=optimizer_state)
        self.step_count = 0
        if not self.lead:
            return
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        # The generation backend shares the trained model when it can, else holds its own copy or engine.
        self.policy = (make_policy(cfg, self.learner.model, self.tokenizer, model_path)
                       if self.learner.shares_weights else worker_policy(cfg, model_path))
        self.allocator = make_allocator(cfg.alloc.allocator, cfg.alloc.group_size, cfg.alloc.cap,
                                        cfg.alloc.flip_scale_prior if cfg.alloc.flip_scale else None)
        self.budget = cfg.alloc.budget
        self.stream: TaskStream | mix.MixedStream = (
            mix.MixedStream.of(self.make_env, cfg.seed, TaskStream) if isinstance(self.make_env, mix.EnvMix)
            else TaskStream(env_tasks(self.make_env), cfg.seed))
        if isinstance(self.stream, mix.MixedStream):
            self.stream.check_pool(cfg.alloc.pool_size)
        if cfg.alloc.pool_size > len(self.stream.tasks):
            raise ConfigError(f"expected alloc.pool_size <= the {len(self.stream.tasks)} training prompts, got "
                              f"{cfg.alloc.pool_size}; fix: alloc.pool_size={len(self.stream.tasks)} or more data")
        self.predictor = make_predictor(cfg, lambda: (hidden_state_fn(self._features_model(), self.tokenizer,
                                                                      env_tag=bool(cfg.env.mix)),
                                                      self.learner.config.hidden_size), self.stream.tasks)
        self.collector = make_collector(cfg, self.policy, self.make_env, self.stream.tasks, self.sampling,
                                        self.tokenizer, model_path)
        self.eval_tasks: list[Task] = (mix.eval_tasks(self.make_eval_env, cfg.eval.tasks)
                                       if isinstance(self.make_eval_env, mix.EnvMix) else
                                       env_tasks(self.make_eval_env)[:cfg.eval.tasks] if cfg.eval.tasks else [])
        self.eval_collector = (eval_collector(self.policy, self.make_eval_env, self.eval_tasks, cfg.eval, cfg.rollout,
                                              cfg.env.workers, self.tokenizer) if self.eval_tasks else None)
        self.history = RunHistory()
        self._expert_seqs: list[tuple[list[int], list[bool]]] | None = None
        if state is not None:
            self._load_state(state)
        dump_config(cfg, self.run_dir / "config.yaml")
        # A resumed run keeps its rows up to the checkpoint; a fresh run in a used folder starts a new file.
        self.logger = MetricsLogger(self.run_dir, cfg.log, cfg.to_dict(),
                                    truncate_after=self.step_count if state is not None else -1)

    # ----------------------------------------------------------------- one step
    def rollout(self, step: int, timer: StageTimer | None = None) -> StepResult:
        """Step ``step`` on the next candidate pool without the policy update: allocate, roll out, expand, fit the
        predictor, build the samples (the allocation benchmark calls this alone, at a fixed policy)."""
        return self._take_step(step, None, timer)

    def step(self) -> dict[str, Any]:
        """One whole step (`training.step.take_step`, the update included), then the weight sync, the trees and
        the evaluation when due; returns the step's metrics."""
        cfg, step = self.cfg, self.step_count + 1
        threads.adapt()
        timer = StageTimer()
        pad_id = self.tokenizer.pad_token_id
        result = self._take_step(step, lambda samples, seed: self.learner.update(samples, seed, pad_id), timer)
        metrics = dict(result.metrics)
        with timer("sync"):
            self.sync_weights()
        self.step_count = step
        if cfg.log.saves_trees(step, cfg.steps):
            with open(self.run_dir / "trees.jsonl", "a") as f:
                f.writelines(json.dumps({"step": step, **t.to_dict()}) + "\n" for t in result.trees.values())
        if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.steps and self.eval_tasks:
            with timer("eval"):
                metrics.update(self.evaluate())
        metrics.update(timer.metrics())
        metrics["data/position"] = float(self.stream.position)
        self.history.add_step(metrics.get("alloc/effective_ratio", float("nan")), result.stats.trajectories,
                              result.stats.generated_tokens)
        return metrics

    def _take_step(self, step: int, update: Update | None, timer: StageTimer | None) -> StepResult:
        cfg = self.cfg
        pool = self.stream.take(cfg.alloc.pool_size)
        result = take_step(self.collector, self.allocator, self.predictor, pool, self.budget, seed=cfg.seed,
                           step=step, advantage=cfg.optim.advantage, update=update,
                           skip_zero=cfg.optim.skip_zero_advantage, timer=timer, predictor_target=cfg.predictor.target)
        if self.mix is not None:
            result.metrics.update(mix.rollout_metrics(pool, result.trees, result.samples.advantages))
        return result

    def sync_weights(self) -> None:
        """Push the trained weights to every generation backend that does not share the trained model."""
        local_stale = not (self.learner.shares_weights and self.cfg.model.backend == "hf")
        remote = self.cfg.distributed == "ray"
        if not (local_stale or remote):
            return
        weights = self.learner.weights()
        assert weights is not None  # on the lead
        if local_stale:
            self.policy.update_weights(weights)
        if remote:  # the local collector plays on self.policy, updated above; Ray workers hold their own
            self.collector.update_weights(weights)

    def _features_model(self) -> torch.nn.Module:
        """The model the hidden-state predictor reads: the hf backend's, else one this process can run."""
        model = getattr(self.policy, "model", None)
        return model if isinstance(model, torch.nn.Module) else self.learner.local_model()

    @property
    def model(self) -> torch.nn.Module:
        """The trained Hugging Face model of this rank (a LoRA model when model.lora_r > 0)."""
        return self.learner.model

    def evaluate(self) -> dict[str, float]:
        """`eval.samples` samples of each of the first `eval.tasks` held-out prompts, with sampling seeds fresh
        for this step (choice 2), and the expert probability when `eval.expert`; returns the eval metrics.
        The per-prompt values are kept for the paired gain of the run (`summary`)."""
        if self.eval_collector is None:
            raise ConfigError("expected eval.tasks > 0 to evaluate, got 0; fix: eval.tasks=64")
        # Plain lines in a log while the episodes play (on a terminal the step's bar is drawn already).
        plain = self.console is not None and self.cfg.log.progress and not self.console.is_terminal
        with Progress("eval episodes", unit="episode", enabled=plain) as bar:
            result = evaluate(self.eval_collector, self.eval_tasks, self.cfg.eval.samples,
                              derive(self.cfg.seed, self.step_count, 3),
                              progress=lambda done, total: bar.update(done=done, total=total))
        by_id = {o.task_id: o for o in result.tasks}
        per_prompt = {"success": [by_id[t.id].success for t in self.eval_tasks],
                      "tool_use": [by_id[t.id].tool_use for t in self.eval_tasks]}
        metrics = result.metrics()
        if self.cfg.eval.expert:
            if self._expert_seqs is None:
                self._expert_seqs = (mix.expert_sequences(self.make_eval_env, self.eval_tasks, self.tokenizer)
                                     if isinstance(self.make_eval_env, mix.EnvMix) else
                                     expert_sequences(self.make_eval_env, self.eval_tasks, self.tokenizer))
            probs = np.exp(expert_logprob(self.learner.model, self._expert_seqs, self.tokenizer.pad_token_id))
            per_prompt["expert"] = probs.tolist()
            metrics["eval/expert_prob"] = float(probs.mean())
        if self.mix is not None:
            metrics.update(mix.eval_metrics(self.eval_tasks, per_prompt))
        self.history.add_eval(self.step_count, result.success, result.tool_use, per_prompt)
        return metrics

    def held_out_gain(self) -> dict[str, PairedDifference]:
        """Last minus first evaluation, per measure, paired over the held-out prompts (95% intervals)."""
        first, last = self.history.eval_first, self.history.eval_last
        if not first or not last or len(self.history.eval) < 2:
            return {}
        return {k: PairedDifference.of(np.subtract(last[k], first[k]).tolist()) for k in first if k in last}

    # ----------------------------------------------------------------- the loop
    def train(self) -> dict[str, Any]:
        """Run up to `cfg.steps` steps with evaluation, checkpoints and progress; returns the summary."""
        cfg = self.cfg
        if not self.lead:
            self.learner.follow()
            return {}
        t_start = time.perf_counter()
        if self.step_count == 0 and self.eval_tasks:
            self.logger.log(0, self.evaluate())
        with StepProgress(cfg.log.progress and self.console is not None, cfg.steps, self.step_count,
                          self.console) as bar:
            while self.step_count < cfg.steps:
                metrics = self.step()
                last = self.step_count == cfg.steps
                if last and self.eval_tasks:
                    metrics.update(self.evaluate())
                self.logger.log(self.step_count, metrics)
                if last or (cfg.checkpoint.every and self.step_count % cfg.checkpoint.every == 0):
                    self.save_checkpoint()
                bar(metrics)
        summary = self.summary(time.perf_counter() - t_start)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if cfg.log.plots:
            plot_at_end(self.run_dir, self.console)
        return summary

    def save_checkpoint(self) -> Path:
        """Checkpoint the run at its current step (`train` does so every `checkpoint.every` steps and at the
        end; a caller that drives `step` itself calls this); returns the checkpoint's folder."""
        return save_checkpoint(self.run_dir, self.step_count, self.learner.save, self.tokenizer, self.predictor,
                               self._state(), keep=self.cfg.checkpoint.keep)

    def summary(self, wall_s: float) -> dict[str, Any]:
        """The run's summary (summary.json and the final table): allocator, steps, held-out success before and
        after with their 95% Wilson intervals over prompts, the paired held-out gains (`held_out_gain`),
        effective ratios, budget, generated tokens and ``wall_s``."""
        ev, tool = self.history.eval, self.history.eval_tool_use
        first, last = self.history.eval_first, self.history.eval_last
        ratios = [r for r in self.history.effective_ratio if not math.isnan(r)]
        gains = {k: {"mean": g.mean, "lo": g.lo, "hi": g.hi, "tasks": g.tasks} for k, g in self.held_out_gain().items()}
        return {
            "run_dir": str(self.run_dir), "steps": self.step_count, "allocator": self.cfg.alloc.allocator,
            "success_before": ev[0][1] if ev else None, "success_after": ev[-1][1] if ev else None,
            "success_before_ci95": _success_interval(first), "success_after_ci95": _success_interval(last),
            "tool_use_before": tool[0][1] if tool else None, "tool_use_after": tool[-1][1] if tool else None,
            "eval_samples": self.cfg.eval.samples, "gain": gains,
            "eval": ev, "effective_ratio_mean": float(np.mean(ratios)) if ratios else None,
            "effective_ratio_first": ratios[0] if ratios else None,
            "effective_ratio_last": ratios[-1] if ratios else None,
            "trajectories_per_step": self.budget.total, "trajectories": self.history.trajectories,
            "generated_tokens": self.history.tokens, "wall_s": wall_s, "warm_start_s": self.warm_start_s,
            **({"envs": mix.summary(self.eval_tasks, first, last)} if self.mix is not None else {}),
        }

    def close(self) -> None:
        """Release the followers, the rollout workers and the log (the lead); nothing to do on followers."""
        if not self.lead:
            return
        self.learner.stop()
        self.collector.close()
        if self.eval_collector is not None:
            self.eval_collector.close()
        self.logger.close()

    # ----------------------------------------------------------------- checkpoint state
    def _state(self) -> dict[str, Any]:
        return {"step": self.step_count, "data_position": self.stream.position, "history": self.history.to_dict(),
                "allocator": self.allocator.state_dict(),
                **({"data_positions": self.stream.positions} if isinstance(self.stream, mix.MixedStream) else {})}

    def _load_state(self, state: Mapping[str, Any]) -> None:
        self.predictor.load_state_dict(state["predictor"])
        self.step_count = int(state["trainer"]["step"])
        if isinstance(self.stream, mix.MixedStream):
            self.stream.positions = state["trainer"].get("data_positions", {})
        else:
            self.stream.position = int(state["trainer"]["data_position"])
        self.history = RunHistory.from_dict(state["trainer"]["history"])
        self.allocator.load_state_dict(state["trainer"].get("allocator", {}))
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])


def _success_interval(per_prompt: Mapping[str, Sequence[float]] | None) -> list[float] | None:
    """The 95% Wilson interval of an evaluation's success over its prompts (as `EvalResult.interval` gives it);
    None when the run kept no per-prompt values (no evaluation, or a checkpoint older than them)."""
    scored = [float(v) for v in (per_prompt or {}).get("success", []) if np.isfinite(v)]
    return list(wilson_interval(float(np.mean(scored)), len(scored))) if scored else None
