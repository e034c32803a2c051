"""Play whole episodes with a policy on a set of envs, batching one generate call per turn across episodes.

Each episode keeps a `Conversation` (exact sampled ids, masks, behaviour logprobs) when the policy has a
tokenizer, so the result is directly trainable; scripted experts play on messages alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym

from trace_gym.agents.chat import Conversation
from trace_gym.agents.policy import Policy, Request, SamplingParams, sample_seed


@dataclass
class Episode:
    """One finished (or cut) episode."""

    task_id: str
    reward: float
    messages: list[dict[str, Any]]
    stop_reason: str
    """The env's `info["stop_reason"]`, or "max_context" when the prompt outgrew `max_context`."""
    conversation: Conversation | None = None
    turns: int = 0
    info: dict[str, Any] = field(default_factory=dict)


def play_episodes(policy: Policy, make_env: Callable[[], gym.Env], resets: Sequence[Mapping[str, Any]],
                  sampling: SamplingParams, tokenizer=None, template_tools: bool = False,
                  max_context: int = 4096, parallel: int = 64) -> list[Episode]:
    """Run one episode per entry of `resets` (keyword arguments of `env.reset`, e.g. `{"seed": 3}` or
    `{"options": {"task_id": "x"}}`), `parallel` at a time; results in the order of `resets`.

    `template_tools` also passes `info["tools"]` to the chat template (off by default: ToolEnv's system prompt
    already states the tools). With a seed, turn t of episode e samples with seed `sample_seed(seed, e, t)`.
    """
    if sampling.n != 1:
        sampling = replace(sampling, n=1)
    tokenizer = tokenizer if tokenizer is not None else getattr(policy, "tokenizer", None)
    token_level = tokenizer is not None and not _is_scripted(policy)
    results: list[Episode | None] = [None] * len(resets)
    envs = [make_env() for _ in range(min(parallel, len(resets)))]
    try:
        for start in range(0, len(resets), len(envs)):
            batch = list(range(start, min(start + len(envs), len(resets))))
            states = []
            for env, e in zip(envs, batch):
                _, info = env.reset(**resets[e])
                conv = (Conversation.start(tokenizer, info["messages"], info.get("tools") if template_tools else None)
                        if token_level else None)
                states.append({"env": env, "e": e, "conv": conv, "messages": list(info["messages"]),
                               "task_id": info["task_id"], "turns": 0})
            active = list(states)
            while active:
                reqs = []
                for s in active:
                    # Per-episode, per-turn seeds keep results independent of how episodes are batched.
                    seed = sample_seed(sampling.seed, s["e"], s["turns"])
                    task = s["env"].unwrapped.task
                    reqs.append(Request(prompt_ids=s["conv"].ids, task=task, seed=seed) if token_level
                                else Request(messages=s["messages"], task=task, seed=seed))
                gens = policy.generate(reqs, sampling)
                still = []
                for s, gen in zip(active, gens):
                    if s["conv"] is not None:
                        s["conv"].add_action(gen.token_ids, gen.text, gen.logprobs)
                    _, reward, terminated, truncated, info = s["env"].step(gen.text)
                    s["turns"] += 1
                    new = info["messages"][len(s["messages"]) + 1:]
                    s["messages"] = list(info["messages"])
                    stop = info.get("stop_reason")
                    if not (terminated or truncated) and s["conv"] is not None:
                        s["conv"].add_observation(new)
                        if len(s["conv"].ids) + sampling.max_new_tokens > max_context:
                            terminated, stop = True, "max_context"
                    if terminated or truncated:
                        results[s["e"]] = Episode(s["task_id"], float(reward), s["messages"],
                                                  stop or ("max_turns" if truncated else "terminated"),
                                                  s["conv"], s["turns"], _json_safe(info))
                    else:
                        still.append(s)
                active = still
    finally:
        for env in envs:
            env.close()
    return [r for r in results if r is not None]


def _is_scripted(policy: Policy) -> bool:
    from trace_gym.agents.scripted import ExpertPolicy

    return isinstance(policy, ExpertPolicy)


def _json_safe(info: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if k != "messages" and isinstance(v, str | int | float | bool | None)}


def success_rate(episodes: Sequence[Episode]) -> float:
    """Fraction of episodes with reward > 0 (rewards are binary by default)."""
    return sum(ep.reward > 0 for ep in episodes) / max(len(episodes), 1)
