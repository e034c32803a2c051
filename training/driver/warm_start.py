"""The warm start RL begins from: scripted-expert episodes collected through a `TreeCollector`, then SFT
(`agents.sft.sft`); and `sft_env`, the body of `trace-gym sft` (training/cli/sft.py), which does the same on any env
and evaluates before and after.

Choices:
1. Expert episodes cycle through the env's tasks from index ``seed``, never touching the first ``holdout``
   (the held-out prompts when evaluation plays the same env: `evaluate.held_out_tasks`). Each expert turn comes
   from a fresh expert seeded by the turn's sampling seed (`ExpertPolicy` with a factory), so the episodes do
   not depend on how rollouts are batched.
2. Episodes are played as bare rollouts with replay snapshots (nothing branches, so no snapshot costs a
   fork), 64 prompts at a time (`evaluate.rollout_chunks`).
3. `trace-gym sft` evaluates on the held-out prompts `evaluate.held_out_tasks` names, with `evaluate.HELD_OUT`'s
   defaults: the first ``eval_episodes`` tasks of the env built with ``eval_env_kwargs`` (a split of its own);
   without them, of the training env, whose expert episodes then leave those tasks out (choice 1).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym

from trace_gym.agents.policy import Policy, SamplingParams
from trace_gym.agents.scripted import ExpertPolicy
from trace_gym.agents.sft import SFTSettings, sft
from trace_gym.env_mix import EnvMix
from trace_gym.env_specs import EnvFactory, env_factory, env_tasks
from trace_gym.errors import ConfigError
from trace_gym.progress import Progress
from trace_gym.training.config import TrainConfig
from trace_gym.training.driver.mix import expert_episodes
from trace_gym.training.rollout.collector import TreeCollector
from trace_gym.training.rollout.evaluate import HELD_OUT, EvalResult, held_out_eval, rollout_chunks

__all__ = ["collect_expert_episodes", "held_out_eval", "sft_env", "warm_start"]  # held_out_eval: evaluate.py's


def collect_expert_episodes(make_env: Callable[[], gym.Env], n: int, noise: float = 0.0, seed: int = 0,
                            only_successful: bool = True, holdout: int = 0,
                            expert: Mapping[str, Any] | None = None, progress: bool = False
                            ) -> list[list[dict[str, Any]]]:
    """Message lists of ``n`` episodes played by the env's scripted expert (``env.expert(noise, seed,
    **expert)``), choice 1; failed episodes are dropped when ``only_successful``. ``progress``: lines (or a bar)
    counting the episodes played."""
    tasks = env_tasks(make_env)
    count = len(tasks) - holdout
    if count < 1:
        raise ConfigError(f"expected holdout below the env's {len(tasks)} tasks, got holdout={holdout}")
    tasks = tasks[holdout:]
    counts = Counter(tasks[(seed + i) % count].id for i in range(n))
    factory, options = EnvFactory.of(make_env), dict(expert or {})
    factory.expert(noise=noise, seed=seed, **options)  # fails now, with the fix, on options it does not take
    policy = ExpertPolicy(lambda s: factory.expert(noise=noise, seed=s, **options))
    collector = TreeCollector(policy, make_env, tasks, SamplingParams(), snapshot_kind="replay")
    episodes = []
    try:
        with Progress("expert episodes", total=n, unit="episode", enabled=progress) as bar:
            for trees in rollout_chunks(collector, counts, seed, progress=lambda done: bar.update(done=done)):
                episodes += [collector.messages(tid, leaf.id) for tid, tree in trees.items()
                             for leaf in tree.leaves() if leaf.reward > 0 or not only_successful]
    finally:
        collector.close()
        factory.close()
    return episodes


def warm_start(cfg: TrainConfig, make_env: Callable[[], gym.Env] | EnvMix, console: Any = None) -> str:
    """The model folder RL starts from: builds the tiny model when asked and absent, then runs SFT on
    scripted-expert episodes when asked and `sft.output` holds no model yet (over an `EnvMix`: each env's expert,
    `mix.expert_episodes`)."""

    base = Path(cfg.model.path)
    if not (base / "config.json").is_file():
        if cfg.model.init_size is None:
            raise ConfigError(f"expected a model folder at model.path={str(base)!r}, got none; fix: point "
                              "model.path at a local model or set model.init_size=tiny to build the tiny model")
        from trace_gym.agents.tiny import build_tiny_model

        _say(console, f"building the {cfg.model.init_size} model at {base}")
        build_tiny_model(base, size=cfg.model.init_size, seed=cfg.seed)
    if not cfg.sft.enabled:
        return str(base)
    out = Path(cfg.sft.output)
    if (out / "config.json").is_file():
        return str(out)
    _say(console, f"warm start: SFT on {cfg.sft.episodes} scripted-expert episodes -> {out}")
    data = (expert_episodes(cfg, make_env, collect_expert_episodes) if isinstance(make_env, EnvMix) else
            collect_expert_episodes(make_env, cfg.sft.episodes, noise=cfg.sft.noise, seed=cfg.seed,
                                    expert=cfg.sft.expert, progress=console is not None))
    sft(base, data, out, SFTSettings(steps=cfg.sft.steps, batch_size=cfg.sft.batch_size, lr=cfg.sft.lr,
                                     processes=cfg.sft.processes, lora_r=cfg.model.lora_r,
                                     lora_alpha=cfg.model.lora_alpha, seed=cfg.seed), progress=console is not None)
    return str(out)


def _say(console: Any, text: str) -> None:
    if console is not None:
        console.print(text)


def sft_env(model_dir: str | Path, env_id: str, episodes: int = 2000, out_dir: str | Path | None = None,
            settings: SFTSettings | None = None, eval_episodes: int = HELD_OUT.tasks, noise: float = 0.0,
            env_kwargs: Mapping[str, Any] | None = None, progress: bool = True,
            eval_env_kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`trace-gym sft --model DIR --env ID --episodes N`: collect expert episodes, fine-tune, evaluate on the
    held-out prompts before and after (choice 3), each phase with its progress lines. Returns a JSON-ready
    summary (also written to `sft_summary.json`)."""
    import trace_gym  # noqa: F401 - registers the trace/* ids
    from trace_gym.agents.hf import HFPolicy

    make_env = env_factory(env_id, env_kwargs)
    make_eval_env = env_factory(env_id, {**(env_kwargs or {}), **eval_env_kwargs}) if eval_env_kwargs else make_env
    data = collect_expert_episodes(make_env, episodes, noise=noise, holdout=0 if eval_env_kwargs else eval_episodes,
                                   progress=progress)

    def held_out(policy: Policy, label: str, sampling: SamplingParams | None = None, seed: int = 0) -> EvalResult:
        with Progress(f"held-out {label}", unit="episode", enabled=progress) as bar:
            return held_out_eval(policy, make_eval_env, eval_episodes, sampling, seed,
                                 progress=lambda done, total: bar.update(done=done, total=total))

    before = held_out(HFPolicy.from_pretrained(model_dir), "before")
    result = sft(model_dir, data, out_dir, settings, progress=progress)
    policy = HFPolicy.from_pretrained(result.out_dir)
    after = held_out(policy, "after")
    sampled = held_out(policy, "after, T = 1", HELD_OUT.sampling(temperature=1.0), seed=1)
    summary = {"env": env_id, "expert_episodes": len(data), "sequences": result.sequences,
               "steps": len(result.losses), "lora_r": (settings or SFTSettings()).lora_r,
               "loss_first": result.losses[0], "loss_last": result.losses[-1],
               "held_out_tasks": len(after.tasks), "held_out_errors": before.errors + after.errors + sampled.errors,
               "success_before_greedy": before.success, "success_after_greedy": after.success,
               "success_after_t1": sampled.success, "out_dir": str(result.out_dir)}
    (result.out_dir / "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
