"""trace-gym envs inside TRL's ``GRPOTrainer``, through its ``rollout_func``: each prompt of the batch is played
as a whole multi-turn episode of the env (tool calls, tool results, the final answer) by the model being
trained, with the exact tokens the trainer then scores.

    rollout = TraceGymRollout("trace/Arithmetic-v0", {"n_tasks": 64}, max_new_tokens=48)
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=rollout.dataset(),
                          reward_funcs=rollout.reward, rollout_func=rollout)

`dataset()` gives one row per task (its prompt: the env's system and user messages); the trainer's batch
repeats each row ``num_generations`` times and hands the prompts to the rollout, which finds each prompt's task,
plays one episode per copy through trace-gym's collector (`TreeCollector`) and returns, per episode,
``prompt_ids`` (the rendered prompt), ``completion_ids`` (every turn's sampled ids followed by the ids of the
env's answer, as the chat template renders it), ``env_mask`` (1 on sampled ids, 0 on the env's), ``logprobs``
(the behaviour logprobs of the sampled ids, 0 on the env's), ``env_reward``, which `reward` passes to the
trainer, and ``env_truncated``. Torch and TRL are imported when a rollout runs, not with this module.

TRL's settings hold:
- ``max_completion_length`` bounds the whole completion, as it does TRL's own tool loop: a turn samples at most
  that many tokens, and an episode whose completion (its turns and the env's answers) is longer is cut there,
  flagged ``env_truncated = 1`` and scored 0, since the tokens the trainer sees stop before the end the env
  scored (as an episode cut by the env's ``max_turns`` earns nothing); each call that cut one logs a warning.
- ``use_vllm``: turns are sampled by the trainer's own vLLM engine, ``trainer.vllm_generation.llm`` in
  ``vllm_mode="colocate"`` (through `VLLMPolicy`; TRL syncs the trainer's weights into it before each rollout),
  else by `HFPolicy` on ``trainer.model``. The server mode, tensor parallelism and sleep mode are refused with
  the fix: their generate call is collective over processes (every process must call it equally often) or
  frees the weights between calls, while episodes end at different turns.
- ``temperature``, ``top_p`` and ``top_k`` are the trainer's; ``min_p`` and ``repetition_penalty`` are not
  applied (the logprob convention of trace_gym.agents.policy has no place for them).

Several envs (``TraceGymRollout(envs={"math": ("trace/Arithmetic-v0", {...}), "chain": (...)})``): the operator names
each env by a key of their own; `dataset()` holds every env's tasks, each row with its ``env`` key and a task id
namespaced by it (``"math/train-3"``, `trace_gym.env_mix`), and each prompt plays on its own env. A prompt is
looked up among the operator's envs' own prompts only, so no row can bring an env of its own; the mix's proportions
are the dataset's (``dataset(tasks={"math": 200, "chain": 100})``).

Choices:
1. Each call gets a fresh collector (the trainer's model changes between calls; the envs are rebuilt, which
   the Arithmetic sandbox does in well under a second).
2. The tokens per turn and the context are this adapter's (``max_new_tokens``, ``max_context``), since a turn
   is not a completion; ``max_completion_length`` caps both.
3. Sampling is seeded from the trainer's step and seed, so a rerun plays the same episodes.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from trace_gym.agents.policy import Policy
from trace_gym.env_mix import EnvMix
from trace_gym.env_specs import EnvFactory, env_factory
from trace_gym.errors import ConfigError
from trace_gym.tasks import Task

__all__ = ["TraceGymRollout", "trainer_policy"]

log = logging.getLogger(__name__)


def trainer_policy(trainer: Any) -> Policy:
    """The policy that samples a trainer's turns: its colocated vLLM engine with ``use_vllm``, else transformers
    on its model (module docstring)."""
    tokenizer = trainer.processing_class
    if not getattr(trainer, "use_vllm", False):
        from trace_gym.agents.hf import HFPolicy

        return HFPolicy(trainer.accelerator.unwrap_model(trainer.model), tokenizer)
    generation = trainer.vllm_generation
    refused = []
    if generation.mode != "colocate":
        refused.append(f"vllm_mode={generation.mode!r}")
    if int(getattr(generation, "tensor_parallel_size", 1)) > 1:
        refused.append(f"vllm_tensor_parallel_size={generation.tensor_parallel_size}")
    if getattr(generation, "enable_sleep_mode", False):
        refused.append("vllm_enable_sleep_mode=True")
    if refused:
        raise ConfigError(f"expected use_vllm with vllm_mode='colocate', one GPU per engine and no sleep mode for "
                          f"multi-turn episodes, got {', '.join(refused)}; fix: GRPOConfig(vllm_mode='colocate', "
                          "vllm_tensor_parallel_size=1, vllm_enable_sleep_mode=False), or use_vllm=False")
    from trace_gym.agents.vllm import VLLMPolicy

    return VLLMPolicy(generation.llm, tokenizer)


class TraceGymRollout:
    """A ``rollout_func`` (and its dataset and reward) for ``GRPOTrainer`` over the env ``spec`` (module
    docstring)."""

    def __init__(self, spec: str | None = None, env_args: Mapping[str, Any] | None = None, max_new_tokens: int = 256,
                 max_context: int = 4096, workers: int = 2,
                 envs: Mapping[str, tuple[str, Mapping[str, Any] | None]] | None = None):
        if (spec is None) == (envs is None):
            raise ConfigError(f"expected one env spec or envs={{key: (spec, env_args)}}, got spec={spec!r} and "
                              f"envs={envs!r}; fix: TraceGymRollout('trace/Arithmetic-v0', {{...}}) or "
                              "TraceGymRollout(envs={'math': ('trace/Arithmetic-v0', {...}), ...})")
        self.spec, self.env_args = spec or ", ".join(envs or {}), dict(env_args or {})
        self.make_env: EnvFactory | EnvMix = (env_factory(spec, self.env_args) if spec is not None else
                                              EnvMix.of({k: (s, a, 1.0) for k, (s, a) in (envs or {}).items()}))
        self.max_new_tokens, self.max_context, self.workers = max_new_tokens, max_context, workers
        by_env = self.make_env.tasks() if isinstance(self.make_env, EnvMix) else {"": self.make_env.tasks()}
        self.tasks: list[Task] = [t for ts in by_env.values() for t in ts]
        self._env: dict[str, str] = {t.id: k for k, ts in by_env.items() for t in ts}
        self._prompts: dict[str, list[dict[str, Any]]] = {}
        for key, tasks in by_env.items():
            factory = self.make_env.factory(key) if isinstance(self.make_env, EnvMix) else self.make_env
            with factory.reading() as env:
                for task in tasks:
                    _, info = env.reset(options={"task": task})
                    self._prompts[task.id] = [dict(m) for m in info["messages"]]
        self._by_prompt = {_key(m): tid for tid, m in reversed(list(self._prompts.items()))}
        self.last: dict[str, Any] = {}
        """The last call's episodes per prompt (task id, rewards, turns), for logs and tests."""

    def dataset(self, tasks: int | Mapping[str, int] | None = None) -> Any:
        """A ``datasets.Dataset`` of the first ``tasks`` tasks (all by default; with several envs, of each env, or
        ``{key: count}`` per env): ``prompt`` (messages) and ``task_id``, and ``env`` (the operator's key) with
        several envs."""
        from datasets import Dataset

        if not isinstance(self.make_env, EnvMix):
            if isinstance(tasks, Mapping):
                raise ConfigError(f"expected a number of tasks for one env, got {dict(tasks)!r}; fix: dataset(N)")
            return Dataset.from_list([{"prompt": self._prompts[t.id], "task_id": t.id} for t in self.tasks[:tasks]])
        counts = dict(tasks) if isinstance(tasks, Mapping) else dict.fromkeys(self.make_env.keys, tasks)
        for key in counts:
            self.make_env.factory(key)  # an unknown key fails here, with the operator's keys
        chosen = [t for key, n in counts.items() for t in [t for t in self.tasks if self._env[t.id] == key][:n]]
        return Dataset.from_list([{"prompt": self._prompts[t.id], "task_id": t.id, "env": self._env[t.id]}
                                  for t in chosen])

    def task_of(self, prompt: Sequence[Mapping[str, Any]] | str) -> Task:
        """The task whose prompt is ``prompt`` (a row of `dataset`)."""
        tid = self._by_prompt.get(_key(prompt))
        if tid is None:
            raise ConfigError(f"expected a prompt of {self.spec}'s dataset, got {str(prompt)[:120]!r}; fix: train on "
                              "rollout.dataset() (its rows are the env's own prompts)")
        return next(t for t in self.tasks if t.id == tid)

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        from trace_gym.agents.policy import SamplingParams
        from trace_gym.seeds import derive
        from trace_gym.training.rollout.collector import TreeCollector, path_tokens

        tasks = [self.task_of(p) for p in prompts]
        counts: dict[str, int] = defaultdict(int)
        for task in tasks:
            counts[task.id] += 1
        tokenizer = trainer.processing_class
        args = trainer.args
        limit = getattr(args, "max_completion_length", None)
        policy = trainer_policy(trainer)
        sampling = SamplingParams(temperature=float(args.temperature), top_p=float(args.top_p or 1.0),
                                  top_k=max(int(getattr(args, "top_k", 0) or 0), 0),
                                  max_new_tokens=min(self.max_new_tokens, int(limit or self.max_new_tokens)))
        unique = {t.id: t for t in tasks}
        collector = TreeCollector(policy, self.make_env, list(unique.values()), sampling, tokenizer, "replay",
                                  self.workers, self.max_context)
        seed = derive(int(args.seed), int(trainer.state.global_step), 0)
        try:
            collector.begin_step()
            collector.bare_rollouts(dict(counts), seed)
            leaves = {tid: list(tree.leaves()) for tid, tree in collector.trees.items()}
            trees = dict(collector.trees)
        finally:
            collector.close()
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                     "env_reward": [], "env_turns": [], "env_truncated": []}
        longest = 0
        for task in tasks:
            leaf = leaves[task.id].pop(0)
            tree = trees[task.id]
            record, segments = path_tokens(tree, leaf.id)
            prompt_end = segments[0].end
            mask: list[int] = []
            logps: list[float] = []
            for seg in segments[1:]:
                n = seg.end - seg.start
                sampled = seg.kind == "action"
                mask += [int(sampled)] * n
                logps += list(seg.logprobs) if sampled and seg.logprobs and len(seg.logprobs) == n else [0.0] * n
            completion = record[prompt_end:]
            longest = max(longest, len(completion))
            cut = limit is not None and len(completion) > int(limit)
            if cut:
                completion, mask, logps = completion[:limit], mask[:limit], logps[:limit]
            out["prompt_ids"].append(record[:prompt_end])
            out["completion_ids"].append(completion)
            out["env_mask"].append(mask)
            out["logprobs"].append(logps)
            out["env_reward"].append(0.0 if cut else float(leaf.reward))
            out["env_turns"].append(int(leaf.depth))
            out["env_truncated"].append(int(cut))
        if any(out["env_truncated"]):
            log.warning("%d of %d episodes were cut at max_completion_length=%d (the longest completion: %d tokens) "
                        "and scored 0; raise max_completion_length, or lower max_new_tokens or the env's max_turns",
                        sum(out["env_truncated"]), len(tasks), limit, longest)
        self.last = {"task_ids": [t.id for t in tasks], "envs": [self._env[t.id] for t in tasks],
                     "rewards": list(out["env_reward"]),
                     "turns": list(out["env_turns"]), "truncated": list(out["env_truncated"])}
        return out

    def env_rewards(self) -> list[Any]:
        """One reward function per env of the mix, named ``env_reward_<key>``: the env reward on that env's rows,
        None on the others (TRL leaves a None out of that function's mean and adds the functions' rewards up). Given
        as ``reward_funcs`` in place of `reward` they score every episode the same, and TRL's log gains each env's
        mean reward (``rewards/env_reward_<key>/mean``)."""
        if not isinstance(self.make_env, EnvMix):
            raise ConfigError("expected a rollout over several envs for per-env rewards, got one env; fix: "
                              "TraceGymRollout(envs={...}), or reward_funcs=rollout.reward")

        def of(key: str) -> Any:
            def env_reward(prompts: Any = None, completions: Any = None, env_reward: Sequence[float] | None = None,
                           env: Sequence[str] | None = None, **kwargs: Any) -> list[float | None]:
                rewards = TraceGymRollout.reward(env_reward=env_reward)
                if env is None:
                    raise ConfigError("expected the dataset's env column, got none; fix: train on rollout.dataset()")
                return [r if e == key else None for r, e in zip(rewards, env, strict=True)]

            env_reward.__name__ = f"env_reward_{key}"
            return env_reward

        return [of(key) for key in self.make_env.keys]

    @staticmethod
    def reward(prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
               env_reward: Sequence[float] | None = None, **kwargs: Any) -> list[float]:
        """The reward function to give ``GRPOTrainer``: each episode's env reward, as the rollout recorded it."""
        if env_reward is None:
            raise ConfigError("expected env_reward from the rollout, got none; fix: pass this object as the "
                              "trainer's rollout_func too")
        return [float(r) for r in env_reward]


def _key(prompt: Sequence[Mapping[str, Any]] | str) -> str:
    """A prompt's identity: its first user message (the task), whatever else the trainer adds."""
    if isinstance(prompt, str):
        return prompt
    users = [str(m.get("content", "")) for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
    return users[0] if users else ""
