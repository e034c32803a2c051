"""Held-out evaluation, the one home of it: what "held-out" means, its defaults, the episodes played one by
one (rows written as they end, resumable), per-prompt outcomes and 95% intervals. `trace-gym eval`/`rollout`,
`trace-gym train` (`Trainer.evaluate`), `trace-gym sft` and the benchmarks all evaluate through here.

`held_out_tasks(make_eval_env, n)` names the prompts: the first ``n`` tasks of the env built with the evaluation's
arguments (a run's ``env.eval_kwargs``, `sft`'s ``--eval-env-arg``). `HELD_OUT` holds the defaults (`EvalConfig`'s
and `RolloutConfig`'s). `evaluate(collector, tasks, samples, seed)` plays ``samples`` episodes of every task and
returns an `EvalResult`: per task the reward, turns and stop reason of each sample, the mean success with a 95%
interval over prompts, and the trees when asked (for the viewer). `paired_difference(before, after)` compares
two evaluations of the same prompts by their per-prompt differences, which removes the prompts' own spread
from the interval (the way to tell whether training changed anything). `expert_sequences` and
`expert_logprob` give the low-noise second measure: per prompt, the teacher-forced probability of the env's
scripted expert trajectory.

Choices:
1. A sample succeeds when its reward is > 0 (rewards are binary by default); a prompt's score is the mean
   over its scored samples, and the success's interval is Wilson's over prompts (prompts are the independent
   draws; samples of one prompt are not): it means something at 0 and 1, where a t-interval collapses to the
   point (training/stats.py). An episode ended by the infrastructure, not the model (``stop_reason``
   "server_error": the policy's server out of retries; "infra_error": the env's answer checker unavailable), is
   not scored: it is counted apart (`EvalResult.infra`) and never lowers the success.
2. Episodes, not turns, are scheduled: at most ``in_flight`` run at once (a model's batch, a server's
   concurrency), all active ones in one generate call per turn, and a finished one is replaced by the next
   before the next call (`TreeCollector.stream`). Prompts start in order and a prompt's env returns to the
   pool when its last episode ends, so at most about ``in_flight`` envs are open. ``on_episode`` hears each
   episode as it ends (the CLI appends it to the rows file then), so an evaluation cut short keeps what finished.
3. Episode k of the i-th task samples with indices derived from (seed, i * (samples + branches) + k, turn),
   whatever ran beside it: a resumed evaluation (``kept``: the episodes an earlier run finished, not replayed)
   draws what an uninterrupted one would. Callers pass a fresh ``seed`` per evaluation (the trainer derives it
   from (run seed, step)), so repeated evaluations do not reuse draws.
4. ``branches`` (tree rollouts, `trace-gym rollout`): after a task's bare samples, its tree is continued
   ``branches`` times, one continuation at a time, each from a node drawn uniformly among the tree's open
   (non-terminal) nodes at that moment, earlier continuations' nodes included, the draws from a generator
   ``generator(seed, i, 1)`` (`trace_gym.seeds`). Their leaves count as episodes of the prompt like its bare
   samples.
5. ``breaker``: that many episodes in a row ended by a failed request stop the evaluation (`EvalStopped`)
   instead of spending every remaining episode's retries on a server that is gone; the finished episodes stand.
6. The expert measure scores P(the expert's actions | its observations) at T = 1 under the trained model, so
   it has no sampling noise: its paired interval over 200 prompts is ~10x narrower than 200 x 2 sampled
   episodes' (docs/learning.md). It exists for envs whose expert plays one canonical solution (Arithmetic);
   a rise says the policy moved toward correct play, not that it samples it, so it goes beside success,
   never instead of it.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from trace_gym.agents.policy import Policy, SamplingParams
from trace_gym.env_mix import EnvMix
from trace_gym.env_specs import EnvFactory, env_tasks
from trace_gym.errors import ConfigError, ServerError
from trace_gym.seeds import derive, generator
from trace_gym.tasks import Task
from trace_gym.training.config import EvalConfig, RolloutConfig
from trace_gym.training.rollout.collector import TreeCollector
from trace_gym.training.stats import PairedDifference, wilson_interval
from trace_gym.tree import Node, RolloutTree
from trace_gym.tree_stats import is_mixed

INFRA_FAILURES = ("server_error", "infra_error")
"""Stop reasons of episodes the infrastructure ended, not the model (choice 1): counted apart, never scored."""


@dataclass(frozen=True)
class HeldOutDefaults:
    """The one set of defaults of a held-out evaluation (`trace-gym eval`, `sft`, a run's ``eval`` section)."""

    tasks: int = EvalConfig.model_fields["tasks"].default
    samples: int = EvalConfig.model_fields["samples"].default
    temperature: float = EvalConfig.model_fields["temperature"].default
    max_new_tokens: int = RolloutConfig.model_fields["max_new_tokens"].default
    max_context: int = RolloutConfig.model_fields["max_context"].default
    in_flight: int = 64
    """Episodes at once for a policy without a ``concurrency`` of its own (a local model's batch; choice 2)."""
    breaker: int = 8
    """Episodes in a row ended by a failed request that stop an evaluation (choice 5)."""

    def sampling(self, temperature: float | None = None, max_new_tokens: int | None = None) -> SamplingParams:
        """The evaluation's sampling: greedy and `max_new_tokens` tokens per turn unless told otherwise."""
        return SamplingParams(temperature=self.temperature if temperature is None else temperature,
                              max_new_tokens=max_new_tokens or self.max_new_tokens)


HELD_OUT = HeldOutDefaults()


def held_out_tasks(make_eval_env: Callable[[], gym.Env], n: int = HELD_OUT.tasks) -> list[Task]:
    """The held-out prompts: the first ``n`` tasks (all of them when 0) of the env built with the evaluation's
    arguments."""
    tasks = env_tasks(make_eval_env)
    return tasks[:n] if n else tasks


@dataclass(frozen=True)
class EpisodeRow:
    """One finished episode, as a line of the rows file: its task, its place among the task's episodes (bare
    samples first, then continuations; it seeds the episode, choice 3) and how it went."""

    task_id: str
    episode: int
    reward: float
    turns: int
    stop_reason: str
    answer: str = ""
    tool_calls: int = 0
    error: str | None = None

    @property
    def scored(self) -> bool:
        """Whether the model, not the infrastructure, ended it (choice 1)."""
        return self.stop_reason not in INFRA_FAILURES

    def row(self) -> dict[str, Any]:
        """The JSONL row: task id, episode, success (None when not scored), reward, turns, stop reason, answer,
        tool calls and error (None unless its generation failed)."""
        return {"task_id": self.task_id, "episode": self.episode,
                "success": float(self.reward > 0) if self.scored else None, "reward": self.reward,
                "turns": self.turns, "stop_reason": self.stop_reason, "answer": self.answer,
                "tool_calls": self.tool_calls, "error": self.error}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> EpisodeRow:
        """The episode a `row` wrote."""
        return cls(str(row["task_id"]), int(row["episode"]), float(row["reward"]), int(row["turns"]),
                   str(row["stop_reason"]), str(row.get("answer") or ""), int(row.get("tool_calls") or 0),
                   row.get("error"))


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

    @classmethod
    def of(cls, task_id: str, episodes: Sequence[EpisodeRow]) -> TaskOutcome:
        """The outcome of a task's episodes, in the order of their ``episode`` numbers."""
        eps = sorted(episodes, key=lambda e: e.episode)
        return cls(task_id, tuple(e.reward for e in eps), tuple(e.turns for e in eps),
                   tuple(e.stop_reason for e in eps), tuple(e.answer for e in eps),
                   tuple(e.tool_calls for e in eps), tuple(e.error for e in eps))

    def episodes(self) -> list[EpisodeRow]:
        """Each sample as an `EpisodeRow`, numbered in order."""
        n = len(self.rewards)
        answers, calls, errors = self.answers or ("",) * n, self.tool_calls or (0,) * n, self.errors or (None,) * n
        return [EpisodeRow(self.task_id, k, *fields) for k, fields in
                enumerate(zip(self.rewards, self.turns, self.stop_reasons, answers, calls, errors))]

    @property
    def scored(self) -> np.ndarray:
        """(samples,) whether each sample is scored (choice 1)."""
        return np.array([r not in INFRA_FAILURES for r in self.stop_reasons], dtype=bool)

    @property
    def success(self) -> float:
        """Share of this prompt's scored samples that succeeded (choice 1); NaN when none is scored."""
        wins = [r > 0 for r, ok in zip(self.rewards, self.scored) if ok]
        return float(np.mean(wins)) if wins else float("nan")

    @property
    def tool_use(self) -> float:
        """Share of this prompt's scored samples that called a tool at least once."""
        used = [n > 0 for n, ok in zip(self.tool_calls, self.scored) if ok]
        return float(np.mean(used)) if used else float("nan")

    @property
    def mixed(self) -> bool:
        """Whether the scored samples hold both a success and a failure (the prompts tree advantages learn from)."""
        return is_mixed(np.array([r > 0 for r in self.rewards]), self.scored)

    def row(self) -> dict[str, Any]:
        """This prompt summed up: task id, success, and each sample's reward, turns, stop reason, answer, tool
        calls and error (None unless its generation failed)."""
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
    def scored(self) -> int:
        """Episodes the model ended (choice 1), over all prompts."""
        return sum(int(t.scored.sum()) for t in self.tasks)

    @property
    def infra(self) -> dict[str, int]:
        """Episodes the infrastructure ended, by stop reason (INFRA_FAILURES, each present)."""
        return {k: sum(r == k for t in self.tasks for r in t.stop_reasons) for k in INFRA_FAILURES}

    @property
    def success(self) -> float:
        """Mean over prompts of each prompt's success (the mean over episodes when samples are equal); prompts
        with no scored sample are left out."""
        return _mean([t.success for t in self.tasks])

    @property
    def tool_use(self) -> float:
        """Mean over prompts of the share of samples that called a tool (the habit RL may teach or unteach)."""
        return _mean([t.tool_use for t in self.tasks])

    @property
    def errors(self) -> int:
        """Episodes the infrastructure ended ("server_error" or "infra_error"), over all prompts."""
        return sum(self.infra.values())

    def interval(self) -> tuple[float, float]:
        """95% Wilson interval of `success` over prompts with a scored sample (choice 1; NaN bounds without)."""
        scored = [t.success for t in self.tasks if np.isfinite(t.success)]
        return wilson_interval(float(np.mean(scored)) if scored else float("nan"), len(scored))

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """Success, its interval bounds, tool use, episodes, the infrastructure's failures and mean turns as
        ``{prefix}name`` floats."""
        lo, hi = self.interval()
        turns = [n for t in self.tasks for n in t.turns]
        return {f"{prefix}success": self.success, f"{prefix}success_lo": lo, f"{prefix}success_hi": hi,
                f"{prefix}tool_use": self.tool_use, f"{prefix}episodes": float(self.episodes),
                f"{prefix}errors": float(self.errors), f"{prefix}scored": float(self.scored),
                f"{prefix}turns": float(np.mean(turns)) if turns else 0.0}

    def rows(self) -> list[dict[str, Any]]:
        """Every episode's row, prompt by prompt in order."""
        return [e.row() for t in self.tasks for e in t.episodes()]

    def write(self, rows: str | Path, trees: str | Path | None = None) -> None:
        """Episode rows as JSONL to ``rows``; the kept trees (the viewer's input) to ``trees`` when given."""
        Path(rows).write_text("".join(json.dumps(r) + "\n" for r in self.rows()))
        if trees is not None:
            Path(trees).write_text("".join(t.to_json() + "\n" for t in self.trees))


class EvalStopped(ServerError):
    """An evaluation stopped by its breaker (choice 5); ``result`` holds the episodes that finished."""

    def __init__(self, message: str, result: EvalResult):
        super().__init__(message)
        self.result = result


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


class RowsFile:
    """An evaluation's rows as it goes (choice 2): one JSON line per finished episode (`EpisodeRow.row`), appended
    and flushed as the episode ends, and beside it ``NAME.settings.json``, what was evaluated. ``resume=True``
    keeps the rows an earlier run wrote (`kept`; a line cut short by a kill is dropped, and so are episodes the
    infrastructure ended, which play again) after checking that its settings are ``settings``; otherwise the
    file starts empty. ``trees`` (a JSONL file, appended as each task
    ends): on resume only the episodes of tasks whose tree was written are kept, the others play again."""

    def __init__(self, path: Path | None, settings: Mapping[str, Any], resume: bool = False,
                 trees: Path | None = None):
        self.path, self.trees = path, trees
        anchor = path or trees
        if anchor is None:
            raise ConfigError("expected a rows or trees file to write, got neither; fix: --out DIR or FILE.jsonl")
        self.settings_path = anchor.with_name(anchor.stem + ".settings.json")
        self.settings = json.loads(json.dumps(dict(settings)))  # as a reread file would hold them
        self.kept: list[EpisodeRow] = []
        self.finished = 0
        """Episodes on file that a resumed run keeps: the kept ones and those the model ended since."""
        if resume:
            self._resume(anchor)
        else:
            anchor.parent.mkdir(parents=True, exist_ok=True)
            self.settings_path.write_text(json.dumps(self.settings, indent=2) + "\n")
            for f in (path, trees):
                if f is not None:
                    f.write_text("")
        self.finished = len(self.kept)
        self._rows = path.open("a") if path is not None else None
        self._trees = trees.open("a") if trees is not None else None

    def _resume(self, anchor: Path) -> None:
        if not self.settings_path.is_file():
            raise ConfigError(f"expected an earlier run's rows to resume at {str(anchor)!r} (and "
                              f"{self.settings_path.name}), got none; fix: drop --resume to start one")
        before = json.loads(self.settings_path.read_text())
        changed = [k for k in sorted(set(before) | set(self.settings)) if before.get(k) != self.settings.get(k)]
        if changed:
            now = ", ".join(f"{k}={self.settings.get(k)!r}" for k in changed)
            then = ", ".join(f"{k}={before.get(k)!r}" for k in changed)
            raise ConfigError(f"expected the settings of the run that wrote {str(anchor)!r} to resume it, got "
                              f"{now} where it ran with {then}; fix: rerun with its settings, or drop --resume to "
                              "start over")
        trees = [RolloutTree.from_json(line) for line in _complete_lines(self.trees)] if self.trees else None
        if self.path is not None:
            rows = [EpisodeRow.from_row(json.loads(line)) for line in _complete_lines(self.path)]
            self.kept = [e for e in rows if e.scored]
            if trees is not None:
                finished = {t.task_id for t in trees}
                self.kept = [e for e in self.kept if e.task_id in finished]
            self.path.write_text("".join(json.dumps(e.row()) + "\n" for e in self.kept))
        elif trees is not None:  # the trees alone say which tasks finished
            self.kept = [_episode(t, leaf, k) for t in trees for k, leaf in enumerate(t.leaves())]

    def episode(self, row: EpisodeRow) -> None:
        """Append ``row`` and flush it to the file (`evaluate`'s ``on_episode``)."""
        self.finished += row.scored
        if self._rows is not None:
            self._rows.write(json.dumps(row.row()) + "\n")
            self._rows.flush()

    def tree(self, tree: RolloutTree) -> None:
        """Append a finished task's tree (`evaluate`'s ``on_tree``)."""
        if self._trees is not None:
            self._trees.write(tree.to_json() + "\n")
            self._trees.flush()

    def finish(self, result: EvalResult) -> None:
        """Rewrite the rows prompt by prompt in order (they were appended as episodes ended), then close."""
        self.close()
        if self.path is not None:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in result.rows()))
            tmp.replace(self.path)

    def close(self) -> None:
        for f in (self._rows, self._trees):
            if f is not None and not f.closed:
                f.close()


def _complete_lines(path: Path) -> list[str]:
    """The whole JSON lines of ``path`` (none when absent); a last line cut short by a kill is rewritten away."""
    if not path.is_file():
        return []
    lines = path.read_text().splitlines(keepends=True)
    whole = []
    for line in lines:
        try:
            json.loads(line)
        except json.JSONDecodeError:
            break
        if line.endswith("\n"):
            whole.append(line)
    if len(whole) != len(lines):
        path.write_text("".join(whole))
    return [line.rstrip("\n") for line in whole]


def paired_difference(before: EvalResult, after: EvalResult) -> PairedDifference:
    """The per-prompt success differences of two evaluations of the same prompts, summarised."""
    b = {t.task_id: t.success for t in before.tasks}
    a = {t.task_id: t.success for t in after.tasks}
    if set(a) != set(b):
        raise ConfigError(f"expected two evaluations of the same prompts, got {len(set(a) ^ set(b))} prompts in "
                          "only one; fix: evaluate both on the same task list")
    return PairedDifference.of([a[tid] - b[tid] for tid in b])


def _episode(tree: RolloutTree, leaf: Node, k: int) -> EpisodeRow:
    return EpisodeRow(tree.task_id, k, float(leaf.reward), leaf.depth, _stop_reason(leaf), _answer(leaf),
                      _tool_calls(tree, leaf), leaf.info.get("error"))


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
             keep_trees: bool = False, branches: int = 0, progress: Callable[[int, int], None] | None = None,
             in_flight: int = HELD_OUT.in_flight, kept: Sequence[EpisodeRow] = (),
             on_episode: Callable[[EpisodeRow], None] | None = None, breaker: int = 0,
             on_tree: Callable[[RolloutTree], None] | None = None) -> EvalResult:
    """``samples`` episodes of each task through ``collector`` (built on the evaluation env and its tasks), and
    ``branches`` continuations of each task's tree (choice 4), ``in_flight`` episodes at once (choice 2).
    ``kept`` episodes are not played again (choice 3); ``on_episode`` hears each new episode as it ends,
    ``on_tree`` each tree as its task ends, ``progress(done, total)`` the episodes finished (kept ones
    included). ``breaker > 0`` stops after that many failed requests in a row (choice 5)."""
    if samples < 1:
        raise ConfigError(f"expected samples >= 1, got {samples}")
    if branches < 0:
        raise ConfigError(f"expected branches >= 0, got {branches}; fix: e.g. 3 continuations per tree, or 0")
    if in_flight < 1:
        raise ConfigError(f"expected in_flight >= 1 episodes at once, got {in_flight}")
    per_task = samples + branches
    done: dict[str, dict[int, EpisodeRow]] = {t.id: {} for t in tasks}
    for e in kept:
        if e.task_id in done and e.episode < per_task:
            done[e.task_id][e.episode] = e
    order = {t.id: i for i, t in enumerate(tasks)}
    pending = deque((t.id, k) for t in tasks for k in range(samples) if k not in done[t.id])
    # Continuations need their task's bare samples: a task's next one waits until none of its episodes runs.
    branch_left = {t.id: [k for k in range(samples, per_task) if k not in done[t.id]] for t in tasks}
    running: dict[str, int] = {}
    trees: dict[str, RolloutTree] = {}
    kept_trees: list[RolloutTree] = []
    total = len(tasks) * per_task
    count = sum(len(d) for d in done.values())
    failures = [0]  # failed requests in a row (choice 5)
    collector.begin_step()

    def start(tid: str, k: int) -> tuple[str, int, int]:
        if tid not in trees:
            trees[tid] = collector.open_tree(tid)
        running[tid] = running.get(tid, 0) + 1
        node = 0
        if k >= samples:  # choice 4
            rng = generator(seed, order[tid], 1, k)
            open_nodes = [n.id for n in trees[tid] if not n.is_terminal]  # the root stays open
            node = open_nodes[int(rng.integers(len(open_nodes)))]
        return tid, node, order[tid] * per_task + k

    def refill(active: int) -> list[tuple[str, int, int]]:
        starts: list[tuple[str, int, int]] = []
        for tid, left in branch_left.items():
            if active + len(starts) >= in_flight:
                return starts
            if left and not running.get(tid) and not any(p[0] == tid for p in pending):
                starts.append(start(tid, left.pop(0)))
        while pending and active + len(starts) < in_flight:
            starts.append(start(*pending.popleft()))
        return starts

    def ended(tid: str, leaf: int, index: int) -> None:
        nonlocal count
        tree = trees[tid]
        row = _episode(tree, tree[leaf], index - order[tid] * per_task)
        done[tid][row.episode] = row
        running[tid] -= 1
        count += 1
        if on_episode is not None:
            on_episode(row)
        if progress is not None:
            progress(count, total)
        if len(done[tid]) == per_task:
            if keep_trees:
                kept_trees.append(tree)
            if on_tree is not None:
                on_tree(tree)
            collector.release(tid)
            del trees[tid]  # its rows are all there is to keep of it
        failures[0] = failures[0] + 1 if row.stop_reason == "server_error" else 0
        if breaker and failures[0] >= breaker:
            raise EvalStopped(f"stopped after {failures[0]} episodes in a row ended on a failed request (the last: "
                              f"{row.error})", result())

    def result() -> EvalResult:
        outcomes = [TaskOutcome.of(t.id, list(done[t.id].values())) for t in tasks if done[t.id]]
        return EvalResult(outcomes, seed, kept_trees)

    if progress is not None:
        progress(count, total)
    collector.stream(refill, derive(seed, 0), ended)
    return result()


def eval_collector(policy: Policy, make_env: Callable[[], gym.Env] | EnvMix, tasks: Sequence[Task],
                   evaluation: EvalConfig, rollout: RolloutConfig, workers: int = 4,
                   tokenizer: Any = None) -> TreeCollector:
    """A collector for held-out evaluation as ``evaluation`` asks (its temperature; the rollout's tokens per turn
    and context; replay snapshots, which cost nothing when no rollout branches)."""
    sampling = SamplingParams(temperature=evaluation.temperature, max_new_tokens=rollout.max_new_tokens)
    return TreeCollector(policy, make_env, tasks, sampling, tokenizer, "replay", workers, rollout.max_context)


def evaluate_policy(policy: Policy, make_env: Callable[[], gym.Env] | EnvMix,
                    tasks: Sequence[Task] | int | None = None,
                    samples: int = 1, sampling: SamplingParams | None = None, seed: int = 0,
                    keep_trees: bool = False, workers: int = 4, max_context: int = HELD_OUT.max_context,
                    branches: int = 0, progress: Callable[[int, int], None] | None = None,
                    in_flight: int | None = None, kept: Sequence[EpisodeRow] = (),
                    on_episode: Callable[[EpisodeRow], None] | None = None, breaker: int = 0,
                    on_tree: Callable[[RolloutTree], None] | None = None) -> EvalResult:
    """Any policy on an env: ``samples`` episodes of each of ``tasks`` (the env's tasks, all of them by default
    or the first ``tasks`` when an int; given as a list with an `EnvMix`, whose tasks are each env's) through a
    fresh `TreeCollector`, plus ``branches`` continuations of
    each task's tree (choice 4); `HELD_OUT`'s sampling unless ``sampling`` is given. Token ids are recorded
    exactly when the policy has a tokenizer (a scripted expert plays on messages). ``in_flight`` defaults to
    the policy's ``concurrency`` (a server's), else `HELD_OUT.in_flight`; the other arguments as in `evaluate`."""
    from trace_gym.agents.scripted import ExpertPolicy

    if isinstance(make_env, EnvMix) and not isinstance(tasks, Sequence):
        raise ConfigError("expected the tasks to play as a list with several envs, got a count; fix: pass "
                          "training.driver.mix.eval_tasks(mix, n)")
    chosen = list(tasks) if isinstance(tasks, Sequence) else env_tasks(make_env)[:tasks]  # type: ignore[arg-type]
    tokenizer = None if isinstance(policy, ExpertPolicy) else getattr(policy, "tokenizer", None)
    width = in_flight or int(getattr(policy, "concurrency", 0) or HELD_OUT.in_flight)
    # Replay snapshots cost nothing until a rollout branches; branching restores native snapshots directly.
    collector = TreeCollector(policy, make_env, chosen, sampling or HELD_OUT.sampling(), tokenizer,
                              "native" if branches else "replay", workers, max_context)
    try:
        return evaluate(collector, chosen, samples, seed, keep_trees, branches, progress, width, kept, on_episode,
                        breaker, on_tree)
    finally:
        collector.close()


def held_out_eval(policy: Policy, make_eval_env: Callable[[], gym.Env], n: int = HELD_OUT.tasks,
                  sampling: SamplingParams | None = None, seed: int = 0,
                  progress: Callable[[int, int], None] | None = None) -> EvalResult:
    """``policy`` on the held-out prompts (`held_out_tasks`: the first ``n`` of the eval env), one sample each,
    with `HELD_OUT`'s sampling unless ``sampling`` is given (`trace-gym sft` before and after)."""
    return evaluate_policy(policy, make_eval_env, held_out_tasks(make_eval_env, n), 1,
                           sampling or HELD_OUT.sampling(), seed, progress=progress)


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
