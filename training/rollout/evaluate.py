"""Held-out evaluation: bare rollouts through a `TreeCollector`, per-prompt outcomes and 95% intervals.

`evaluate(collector, tasks, samples, seed)` plays ``samples`` episodes of every task and returns an
`EvalResult`: per task the reward, turns and stop reason of each sample, the mean success with a 95%
interval over prompts, and the trees when asked (for the viewer). `paired_difference(before, after)` compares
two evaluations of the same prompts by their per-prompt differences, which removes the prompts' own spread
from the interval (the way to tell whether training changed anything). `expert_sequences` and
`expert_logprob` give the low-noise second measure: per prompt, the teacher-forced probability of the env's
scripted expert trajectory.

Choices:
1. A sample succeeds when its reward is > 0 (rewards are binary by default); a prompt's score is the mean
   over its samples, and the success's interval is Wilson's over prompts (prompts are the independent draws;
   samples of one prompt are not): it means something at 0 and 1, where a t-interval collapses to the point
   (training/stats.py). A sample whose generation failed (a server out of retries) is a failure, counted in
   `EvalResult.errors`.
2. Prompts are played ``chunk`` at a time (default 64) through one collector step each, so at most that many
   envs are open; chunk c samples with seed ``derive(seed, c, 0)``. Callers pass a fresh ``seed`` per
   evaluation (the trainer derives it from (run seed, step)), so repeated evaluations do not reuse draws.
3. ``branches`` (tree rollouts, `trace-gym rollout`): after a chunk's bare rollouts, each tree is continued
   ``branches`` times, in rounds of one continuation per tree, each from a node drawn uniformly among the
   tree's open (non-terminal) nodes at that moment, earlier continuations' nodes included; round b samples
   with ``derive(seed, c, 2 + b)`` and the draws come from a generator
   ``generator(seed, c, 1)`` (`trace_gym.seeds`). Their leaves count as episodes of the prompt like its bare samples.
4. The expert measure scores P(the expert's actions | its observations) at T = 1 under the trained model, so
   it has no sampling noise: its paired interval over 200 prompts is ~10x narrower than 200 x 2 sampled
   episodes' (docs/learning.md). It exists for envs whose expert plays one canonical solution (Arithmetic);
   a rise says the policy moved toward correct play, not that it samples it, so it goes beside success,
   never instead of it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from trace_gym.agents.policy import Policy, SamplingParams
from trace_gym.env_specs import EnvFactory, env_tasks
from trace_gym.errors import ConfigError
from trace_gym.seeds import derive, generator
from trace_gym.tasks import Task
from trace_gym.training.config import EvalConfig, RolloutConfig
from trace_gym.training.rollout.collector import TreeCollector
from trace_gym.training.stats import PairedDifference, mean_ci95, wilson_interval
from trace_gym.tree import Node, RolloutTree
from trace_gym.tree_stats import is_mixed


@dataclass(frozen=True)
class TaskOutcome:
    """One prompt's samples: reward, turns, the env's stop reason and the answer text of each."""

    task_id: str
    rewards: tuple[float, ...]
    turns: tuple[int, ...]
    stop_reasons: tuple[str, ...]
    answers: tuple[str, ...] = ()
    """What each sample said last: the answer the env read, else the last turn's text (capped at 2,000 chars)."""
    tool_calls: tuple[int, ...] = ()
    """Tool calls each sample made (``info["tool_calls"]`` summed over its turns)."""
    errors: tuple[str | None, ...] = ()
    """Why each sample's generation failed, when it did (``info["error"]``: a server out of retries), else None."""

    @property
    def success(self) -> float:
        """Share of this prompt's samples that succeeded (choice 1)."""
        return float(np.mean([r > 0 for r in self.rewards])) if self.rewards else float("nan")

    @property
    def tool_use(self) -> float:
        """Share of this prompt's samples that called a tool at least once."""
        return float(np.mean([n > 0 for n in self.tool_calls])) if self.tool_calls else float("nan")

    @property
    def mixed(self) -> bool:
        """Whether the samples hold both a success and a failure (the prompts tree advantages learn from)."""
        return is_mixed(np.array([r > 0 for r in self.rewards]), np.ones(len(self.rewards), dtype=bool))

    def row(self) -> dict[str, Any]:
        """The JSONL row of this prompt: task id, success, and each sample's reward, turns, stop reason, answer,
        tool calls and error (None unless its generation failed)."""
        return {"task_id": self.task_id, "success": self.success, "rewards": list(self.rewards),
                "turns": list(self.turns), "stop_reasons": list(self.stop_reasons), "answers": list(self.answers),
                "tool_calls": list(self.tool_calls), "errors": list(self.errors)}


@dataclass
class EvalResult:
    """Per-prompt outcomes of one evaluation (``seed`` drew its samples), and its trees when kept."""

    tasks: list[TaskOutcome]
    seed: int
    trees: list[RolloutTree] = field(default_factory=list)

    @property
    def episodes(self) -> int:
        """Episodes played, over all prompts."""
        return sum(len(t.rewards) for t in self.tasks)

    @property
    def success(self) -> float:
        """Mean over prompts of each prompt's success (the mean over episodes when samples are equal)."""
        return mean_ci95([t.success for t in self.tasks])[0]

    @property
    def tool_use(self) -> float:
        """Mean over prompts of the share of samples that called a tool (the habit RL may teach or unteach)."""
        return mean_ci95([t.tool_use for t in self.tasks])[0]

    @property
    def errors(self) -> int:
        """Episodes that ended on a failed generation (``stop_reason`` "server_error"), over all prompts."""
        return sum(r == "server_error" for t in self.tasks for r in t.stop_reasons)

    def interval(self) -> tuple[float, float]:
        """95% Wilson interval of `success` over prompts (choice 1; NaN bounds without prompts)."""
        scored = [t.success for t in self.tasks if np.isfinite(t.success)]
        return wilson_interval(float(np.mean(scored)) if scored else float("nan"), len(scored))

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """Success, its interval bounds, tool use, episodes and mean turns as ``{prefix}name`` floats."""
        lo, hi = self.interval()
        turns = [n for t in self.tasks for n in t.turns]
        return {f"{prefix}success": self.success, f"{prefix}success_lo": lo, f"{prefix}success_hi": hi,
                f"{prefix}tool_use": self.tool_use, f"{prefix}episodes": float(self.episodes),
                f"{prefix}errors": float(self.errors), f"{prefix}turns": float(np.mean(turns)) if turns else 0.0}

    def write(self, rows: str | Path, trees: str | Path | None = None) -> None:
        """Per-task rows as JSONL to ``rows``; the kept trees (the viewer's input) to ``trees`` when given."""
        Path(rows).write_text("".join(json.dumps(t.row()) + "\n" for t in self.tasks))
        if trees is not None:
            Path(trees).write_text("".join(t.to_json() + "\n" for t in self.trees))


def paired_difference(before: EvalResult, after: EvalResult) -> PairedDifference:
    """The per-prompt success differences of two evaluations of the same prompts, summarised."""
    b = {t.task_id: t.success for t in before.tasks}
    a = {t.task_id: t.success for t in after.tasks}
    if set(a) != set(b):
        raise ConfigError(f"expected two evaluations of the same prompts, got {len(set(a) ^ set(b))} prompts in "
                          "only one; fix: evaluate both on the same task list")
    return PairedDifference.of([a[tid] - b[tid] for tid in b])


def _outcome(tree: RolloutTree) -> TaskOutcome:
    leaves = tree.leaves()
    return TaskOutcome(tree.task_id, tuple(float(n.reward) for n in leaves), tuple(n.depth for n in leaves),
                       tuple(_stop_reason(n) for n in leaves), tuple(_answer(n) for n in leaves),
                       tuple(_tool_calls(tree, n) for n in leaves), tuple(n.info.get("error") for n in leaves))


def _tool_calls(tree: RolloutTree, leaf: Node) -> int:
    return sum(int(n.info.get("tool_calls", 0) or 0) for n in tree.path(leaf.id))


def _answer(leaf: Node, limit: int = 2000) -> str:
    answer = leaf.info.get("answer")
    text = str(answer) if answer is not None else (leaf.action or "")
    return text if len(text) <= limit else text[:limit] + f"[... {len(text) - limit} more characters]"


def _stop_reason(leaf: Node) -> str:
    reason = leaf.info.get("stop_reason")
    return str(reason) if reason else ("max_turns" if leaf.truncated else "terminated")


def rollout_chunks(collector: TreeCollector, counts: Mapping[str, int], seed: int, chunk: int = 64,
                   branches: int = 0, progress: Callable[[int], None] | None = None
                   ) -> Iterator[dict[str, RolloutTree]]:
    """Bare rollouts of ``counts`` (task id -> samples), ``chunk`` prompts per collector step (choice 2), then
    ``branches`` continuations of each tree (choice 3); yields each chunk's trees, which stay valid after the
    next chunk starts. ``progress(n)`` hears the episodes finished so far after each collector call."""
    if branches < 0:
        raise ConfigError(f"expected branches >= 0, got {branches}; fix: e.g. 3 continuations per tree, or 0")
    ids = [tid for tid, m in counts.items() if m > 0]
    done = 0
    for c, start in enumerate(range(0, len(ids), chunk)):
        collector.begin_step()
        done += collector.bare_rollouts({tid: counts[tid] for tid in ids[start:start + chunk]},
                                        derive(seed, c, 0)).trajectories
        if progress is not None:
            progress(done)
        rng = generator(seed, c, 1)
        for b in range(branches):
            starts = {}
            for tid, tree in collector.trees.items():
                open_nodes = [n.id for n in tree if not n.is_terminal]  # the root stays open
                starts[(tid, open_nodes[int(rng.integers(len(open_nodes)))])] = 1
            done += collector.continuations(starts, derive(seed, c, 2 + b)).trajectories
            if progress is not None:
                progress(done)
        yield collector.trees


def evaluate(collector: TreeCollector, tasks: Sequence[Task], samples: int, seed: int,
             keep_trees: bool = False, branches: int = 0, progress: Callable[[int, int], None] | None = None
             ) -> EvalResult:
    """``samples`` episodes of each task through ``collector`` (built on the evaluation env and its tasks), and
    ``branches`` continuations of each task's tree (choice 3). ``progress(done, total)`` hears the episodes
    finished after each collector call (total: every sample and continuation)."""
    if samples < 1:
        raise ConfigError(f"expected samples >= 1, got {samples}")
    outcomes: list[TaskOutcome] = []
    trees: list[RolloutTree] = []
    total = len(tasks) * (samples + branches)
    report = None if progress is None else (lambda done: progress(done, total))
    for part in rollout_chunks(collector, {t.id: samples for t in tasks}, seed, branches=branches, progress=report):
        outcomes.extend(_outcome(tree) for tree in part.values())
        if keep_trees:
            trees.extend(part.values())
    return EvalResult(outcomes, seed, trees)


def eval_collector(policy: Policy, make_env: Callable[[], gym.Env], tasks: Sequence[Task], evaluation: EvalConfig,
                   rollout: RolloutConfig, workers: int = 4, tokenizer: Any = None) -> TreeCollector:
    """A collector for held-out evaluation as ``evaluation`` asks (its temperature; the rollout's tokens per turn
    and context; replay snapshots, which cost nothing when no rollout branches)."""
    sampling = SamplingParams(temperature=evaluation.temperature, max_new_tokens=rollout.max_new_tokens)
    return TreeCollector(policy, make_env, tasks, sampling, tokenizer, "replay", workers, rollout.max_context)


def evaluate_policy(policy: Policy, make_env: Callable[[], gym.Env], tasks: Sequence[Task] | int | None = None,
                    samples: int = 1, sampling: SamplingParams | None = None, seed: int = 0,
                    keep_trees: bool = False, workers: int = 4, max_context: int = 4096, branches: int = 0,
                    progress: Callable[[int, int], None] | None = None) -> EvalResult:
    """Any policy on an env: ``samples`` episodes of each of ``tasks`` (the env's tasks, all of them by default
    or the first ``tasks`` when an int) through a fresh `TreeCollector`, plus ``branches`` continuations of
    each task's tree (choice 3). Token ids are recorded exactly when the policy has a tokenizer (a scripted
    expert plays on messages). ``progress(done, total)`` hears every finished episode (a progress bar)."""
    from trace_gym.agents.scripted import ExpertPolicy

    chosen = list(tasks) if isinstance(tasks, Sequence) else env_tasks(make_env)[:tasks]
    tokenizer = None if isinstance(policy, ExpertPolicy) else getattr(policy, "tokenizer", None)
    counter = None if progress is None else _EpisodeCounter(progress, len(chosen) * (samples + branches))
    envs = make_env if counter is None else (lambda: _CountingEnv(make_env(), counter))
    # Replay snapshots cost nothing until a rollout branches; branching restores native snapshots directly.
    collector = TreeCollector(policy, envs, chosen, sampling or SamplingParams(), tokenizer,
                              "native" if branches else "replay", workers, max_context)
    try:
        return evaluate(collector, chosen, samples, seed, keep_trees, branches,
                        None if counter is None else counter.reached)
    finally:
        collector.close()


def expert_sequences(make_env: Any, tasks: Sequence[Any], tokenizer: Any) -> list[tuple[list[int], list[bool]]]:
    """(ids, action mask) of the env's scripted expert (noise 0) playing each task once, tokenised as SFT sees
    it; one per task, in the order of ``tasks``."""
    from trace_gym.agents.chat import tokenize_episode
    from trace_gym.agents.scripted import ExpertPolicy

    factory = EnvFactory.of(make_env)
    if not factory.has_expert:
        factory.close()
        raise ConfigError(f"expected an env with a scripted expert for the expert-probability measure, got "
                          f"{factory.spec or 'the env'} without one; fix: eval.expert=false")
    policy = ExpertPolicy(lambda s: factory.expert(noise=0.0, seed=s))
    collector = TreeCollector(policy, make_env, tasks, SamplingParams(), snapshot_kind="replay")
    messages: dict[str, list[dict[str, Any]]] = {}
    try:
        for trees in rollout_chunks(collector, {t.id: 1 for t in tasks}, seed=0):
            messages.update({tid: collector.messages(tid, tree.leaves()[0].id) for tid, tree in trees.items()})
    finally:
        collector.close()
        factory.close()
    out = []
    for task in tasks:
        conv = tokenize_episode(tokenizer, messages[task.id])
        out.append((conv.ids, conv.action_mask()))
    return out


def expert_logprob(model: Any, seqs: Sequence[tuple[list[int], list[bool]]], pad_id: int,
                   batch: int = 64) -> np.ndarray:
    """(n,) log-probability at T = 1 of each sequence's action tokens (masked) under ``model`` (a torch model;
    torch is imported here so that evaluation without a local model needs no torch)."""
    import torch

    from trace_gym.agents.hf import sequence_logprobs
    from trace_gym.agents.padding import attention_mask, pad_rows

    was = model.training
    model.eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(seqs), batch):
            part = seqs[s:s + batch]
            ids = pad_rows([i for i, _ in part], pad_id)
            att = attention_mask([i for i, _ in part])
            mask = pad_rows([m for _, m in part], 0.0, torch.float32, width=ids.shape[1])
            device = next(model.parameters()).device
            lp = sequence_logprobs(model, ids.to(device), att.to(device)).cpu()
            out.append((lp * mask[:, 1:]).sum(-1).double().numpy())
    model.train(was)
    return np.concatenate(out) if out else np.zeros(0)


class _EpisodeCounter:
    """Counts finished episodes for ``progress(done, total)``: one per env step that ends an episode (as they
    happen, from the env threads), set to the collector's exact count after each collector call (a rollout cut
    at ``max_context`` ends without an env step)."""

    def __init__(self, progress: Callable[[int, int], None], total: int):
        self.progress, self.total, self.done = progress, total, 0
        self._lock = threading.Lock()

    # Reported under the lock, so that the counts heard never go backwards.
    def ended(self) -> None:
        with self._lock:
            self.done += 1
            self.progress(self.done, self.total)

    def reached(self, done: int, total: int) -> None:
        with self._lock:
            self.done = max(self.done, done)
            self.progress(self.done, total)


class _CountingEnv(gym.Wrapper):
    """Tells ``counter`` when a step ends the episode (snapshots and restores go to the env underneath)."""

    def __init__(self, env: gym.Env, counter: _EpisodeCounter):
        super().__init__(env)
        self.counter = counter

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        out = self.env.step(action)
        if out[2] or out[3]:
            self.counter.ended()
        return out

    def restore_branch(self, path: Sequence[Node]) -> None:
        """No state of its own to restore (``BranchAware``)."""
