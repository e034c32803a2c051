"""Base classes: ``TextEnv`` (string observations and actions, one episode = one task, one step = one turn)
and ``ToolEnv`` (declared tools, an action parser, a verifier)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import gymnasium as gym

from trace_gym.actions import ActionParser, HermesParser, TagParser
from trace_gym.errors import ConfigError, InfraError, SnapshotError, TraceGymError
from trace_gym.experts import Expert
from trace_gym.limits import Footprint
from trace_gym.snapshot import NativeSnapshot, ReplaySnapshot, Snapshot
from trace_gym.spaces import String
from trace_gym.tasks import Task
from trace_gym.tools import Tool, call_tool

_BASE_FIELDS = frozenset({"task", "turn_count", "messages", "observation_space", "action_space", "max_turns",
                          "max_action_chars", "render_mode", "tasks", "spec", "parser", "tool_map", "max_tool_calls",
                          "max_result_chars", "tool_instructions"})
_MISSING = object()
NATIVE_INSTRUCTIONS = ("Call the tools you are given when they help; their results come back in the next messages. "
                       "When you know the final answer, reply with it alone, without a tool call.")
_FINGERPRINT_BUDGET = 10_000


def fingerprint(value: Any, budget: list[int] | None = None) -> Any:
    """A comparable summary of ``value``: plain data (scalars, and lists, tuples, dicts and sets of plain data,
    up to 10,000 items) by value, anything else by identity."""
    budget = budget if budget is not None else [_FINGERPRINT_BUDGET]
    if isinstance(value, float):
        return ("float", repr(value))  # repr: NaN equals itself
    if value is None or isinstance(value, bool | int | str | bytes):
        return value
    if isinstance(value, list | tuple | dict | set | frozenset):
        budget[0] -= len(value)
        if budget[0] < 0:
            return ("object", id(value), len(value))
        if isinstance(value, dict):
            return ("dict", tuple((fingerprint(k, budget), fingerprint(v, budget)) for k, v in value.items()))
        if isinstance(value, set | frozenset):
            return ("set", frozenset(fingerprint(v, budget) for v in value))
        return (type(value).__name__, tuple(fingerprint(v, budget) for v in value))
    return ("object", id(value))


@dataclass
class Turn:
    """The outcome of one assistant turn, as an env's ``turn()`` reports it."""

    observation: str
    reward: float = 0.0
    terminated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None  # appended after the assistant message; default: one tool message


class TextEnv(gym.Env[str, str]):
    """An episode is a task; a step is a turn.

    **Hooks** (what a subclass overrides; the "hooks" sections below): ``turn`` (required), ``load_tasks`` (or
    pass ``tasks=``), ``begin``, ``reset_info``, ``example_actions``, ``expert``; the class attributes
    ``episode_fields`` and ``untracked_fields``; ``host_footprint`` for an env whose episodes hold OS
    resources; for state that cannot be deep-copied, ``state_dict`` / ``load_state_dict`` or
    ``native_snapshot``. **Plumbing** (call it, do not override it: it keeps the
    contracts below): ``reset``, ``step``, ``snapshot``, ``restore``, ``replay``, ``current``, ``base_state``,
    ``tasks``, ``task_by_id``. ``step`` truncates an episode at ``max_turns`` (stop reason ``max_turns``), so
    the limit is part of the episode and of its snapshots; behaviour across episodes (tree recording) belongs
    in a wrapper.

    ``episode_fields`` names the attributes that hold per-episode state beyond the base's; native snapshots
    deep-copy them (override ``state_dict``/``load_state_dict`` or ``native_snapshot`` for anything else).
    A native snapshot refuses to miss state: a public attribute that changed since the episode began (after
    ``begin``) but is not an episode field raises ``SnapshotError`` naming it. Plain data (numbers, strings,
    lists, dicts, sets, tuples) is compared by value, other objects by identity. Attributes whose name starts
    with ``_`` (caches) and those in ``untracked_fields`` are not checked.

    Rewards belong to episodes: the reward of the turn that terminates the episode. A non-zero reward on any
    other turn raises ``TraceGymError`` (it would otherwise be lost).
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"]}  # noqa: RUF012 - gymnasium's class attribute
    episode_fields: tuple[str, ...] = ()
    untracked_fields: tuple[str, ...] = ()
    """Public attributes that change during an episode yet are not episode state (statistics), or that a custom
    ``native_snapshot`` captures itself."""
    expert: Callable[..., Expert] | None = None
    """Hook (optional): define ``def expert(self, noise: float = 0.0, seed: int = 0) -> Expert``, a scripted player
    of this env's tasks (warm-start data, the checker's well-formed turns, ``--policy expert``). ``None`` here
    means the env has none, which is what callers test for."""

    @staticmethod
    def host_footprint(branching: bool) -> Footprint | None:
        """Hook (optional): what one trajectory of this env holds on the host at a step's peak (processes,
        descriptors, namespaces, memory: `trace_gym.limits.Footprint`), with native snapshots kept where the
        allocator branches (``branching``) or not. The trainer checks a step's total against the host's limits
        before the first step. None (this default): nothing beyond Python objects."""
        return None

    def __init__(self, tasks: Sequence[Task] | None = None, max_turns: int = 8, render_mode: str | None = None,
                 max_action_chars: int = 32_000):
        if max_turns < 1:
            raise ConfigError(f"expected max_turns >= 1, got {max_turns}")
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"expected render_mode None or 'ansi', got {render_mode!r}")
        self.observation_space = String()
        self.action_space = String()
        self.max_turns = max_turns
        self.max_action_chars = max_action_chars
        self.render_mode = render_mode
        self._given_tasks = list(tasks) if tasks is not None else None
        self.task: Task | None = None
        self.turn_count = 0
        self.messages: list[dict[str, Any]] = []
        self._actions: list[str] = []
        self._done = False
        self._last: tuple[str, dict[str, Any]] = ("", {})
        self._rng_after_reset: dict[str, Any] = {}
        self._fingerprints: dict[str, Any] = {}

    # ----------------------------------------------------------------- plumbing: the dataset
    @cached_property
    def tasks(self) -> Sequence[Task]:
        """The dataset: the constructor's ``tasks=``, else ``load_tasks()`` (called once, on first use)."""
        tasks = self._given_tasks if self._given_tasks is not None else list(self.load_tasks())
        if not tasks:
            raise ConfigError(f"{type(self).__name__} has an empty dataset; pass tasks= or check the data path")
        return tasks

    @cached_property
    def _task_index(self) -> dict[str, Task]:
        return {t.id: t for t in self.tasks}

    def task_by_id(self, task_id: str) -> Task:
        """The task whose ``id`` is ``task_id``; ``ConfigError`` when the dataset has none."""
        try:
            return self._task_index[task_id]
        except KeyError:
            raise ConfigError(f"expected a task id of this dataset, got {task_id!r}") from None

    # ----------------------------------------------------------------- hooks: an episode
    def load_tasks(self) -> Sequence[Task]:
        """Hook: the env's tasks; subclasses with a dataset override it (``tasks`` calls it once, lazily)."""
        raise ConfigError(f"{type(self).__name__} has no dataset: pass tasks= or override load_tasks()")

    def begin(self, task: Task) -> str:
        """Hook: set up per-episode state; return the first observation. ``self.messages`` is empty when it is called:
        fill it with the chat the episode starts from (this default: the task prompt as the user message)."""
        self.messages = [{"role": "user", "content": task.prompt}]
        return task.prompt

    def turn(self, action: str) -> Turn:
        """Hook (required): play one assistant turn, ``action``, and report its outcome as a ``Turn``. ``step`` has
        already counted the turn and recorded the action; it records the outcome, truncates and checks rewards."""
        raise NotImplementedError(f"{type(self).__name__} must implement turn(action)")

    def example_actions(self) -> list[str]:
        """Hook: a few well-formed actions for the current task (used by the conformance checker and fuzzers)."""
        return []

    def reset_info(self) -> dict[str, Any]:
        """Hook: extra keys of the ``info`` that ``reset`` returns (``ToolEnv``: the tool schemas)."""
        return {}

    # ----------------------------------------------------------------- plumbing: the gymnasium API
    @property
    def done(self) -> bool:
        """Whether the episode has ended (terminated or truncated): ``step`` raises until ``reset`` or a restore."""
        return self._done

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on the task that ``options`` names (``{"task": Task}``, ``{"task_id": id}`` or ``{"index":
        i}``), else on a random one drawn with ``seed``. Returns the first observation and ``info`` (``task_id``,
        ``turn``, ``messages``, and ``reset_info()``)."""
        super().reset(seed=seed)
        task = self._choose_task(options or {})
        self._rng_after_reset = copy.deepcopy(dict(self.np_random.bit_generator.state))
        return self._start(task)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play the assistant turn ``action``: ``(observation, reward, terminated, truncated, info)``. A malformed
        action gives an error observation (``info["error"]``), never an exception; the reward comes with the last
        turn, and ``max_turns`` truncates. A turn that shared infrastructure failed (``InfraError``: no answer
        checker in time) ends the episode unscored: reward 0.0, truncated, ``info["stop_reason"] = "infra_error"``
        and the reason in ``info["error"]``."""
        if self.task is None:
            raise TraceGymError("expected reset() before step(); call env.reset()")
        if self._done:
            raise TraceGymError("the episode is over; call reset() or restore a snapshot before step()")
        if not isinstance(action, str):
            raise TypeError(f"expected the action as str (the assistant's turn), got {type(action).__name__}")
        self._actions.append(action)
        self.turn_count += 1
        self.messages.append({"role": "assistant", "content": action})
        infra = False
        if len(action) > self.max_action_chars:
            msg = f"action of {len(action)} characters exceeds the limit of {self.max_action_chars}"
            result = Turn(f"Error: {msg}", info={"error": msg})
        else:
            try:
                result = self.turn(action)
            except InfraError as exc:  # not the model's doing: the episode ends unscored (errors.InfraError)
                infra, reason = True, " ".join(str(exc).split())[:500]
                result = Turn(f"Error: the turn could not be finished ({reason}); the episode is not scored",
                              info={"stop_reason": "infra_error", "error": reason}, messages=[])
        self.messages.extend(result.messages if result.messages is not None
                             else [{"role": "tool", "content": result.observation}])
        truncated = infra or (not result.terminated and self.turn_count >= self.max_turns)
        info = dict(result.info)
        if truncated and not infra:
            info["stop_reason"] = "max_turns"
        self._done = result.terminated or truncated
        reward = float(result.reward)
        if not result.terminated and reward != 0.0:
            raise TraceGymError(f"expected reward 0 on a turn that does not terminate the episode, got {reward}; "
                                "fix: an episode's reward is the reward of its terminating turn: keep partial "
                                "credit in an episode field and return it when the episode terminates")
        info = self._with_base_info(info)
        self._last = (result.observation, info)
        return result.observation, reward, result.terminated, truncated, info

    def render(self) -> str | None:
        """The conversation so far as text when ``render_mode="ansi"``, else None."""
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{m['role']}] {m['content']}" for m in self.messages)

    # ----------------------------------------------------------------- plumbing: snapshots
    def snapshot(self, kind: Literal["native", "replay"] = "native", *, resources: bool = True) -> Snapshot:
        """Capture the episode. ``native`` is fast and local; ``replay`` is portable across instances.
        ``resources=False`` asks for a native snapshot that holds no OS resource (no frozen sandbox process): an
        env whose native snapshots hold one rebuilds it when the restored episode next needs it (the sandbox
        re-runs its cells), so the snapshot costs nothing until restored."""
        if self.task is None:
            raise SnapshotError("expected a started episode; call reset() before snapshot()")
        if kind == "native":
            self._check_untracked_state()
            return self.native_snapshot() if resources else self.native_snapshot(resources=False)
        if kind == "replay":
            return ReplaySnapshot(type(self).__qualname__, self.task, copy.deepcopy(self._rng_after_reset),
                                  tuple(self._actions))
        raise ConfigError(f"expected snapshot kind 'native' or 'replay', got {kind!r}")

    def restore(self, snapshot: Snapshot) -> tuple[str, dict[str, Any]]:
        """Return the env to ``snapshot``'s state; returns that state's observation and info."""
        return snapshot.restore_into(self)

    def base_state(self) -> dict[str, Any]:
        """The base class's episode state (task, turn count, messages, actions, done, RNG), for native snapshots."""
        return {
            "task": self.task, "turn_count": self.turn_count, "messages": self.messages,
            "actions": self._actions, "done": self._done, "last": self._last,
            "rng": self.np_random.bit_generator.state, "rng_after_reset": self._rng_after_reset,
        }

    def load_base_state(self, state: Mapping[str, Any]) -> None:
        """Restore a ``base_state()``."""
        self.task, self.turn_count, self.messages = state["task"], state["turn_count"], state["messages"]
        self._actions, self._done, self._last = state["actions"], state["done"], state["last"]
        self.np_random.bit_generator.state = state["rng"]
        self._rng_after_reset = state["rng_after_reset"]

    def replay(self, task: Task, rng_state: dict[str, Any], actions: Sequence[str]) -> tuple[str, dict[str, Any]]:
        """Start ``task`` with the RNG in ``rng_state`` and play ``actions`` (what a replay snapshot restores)."""
        self.np_random.bit_generator.state = rng_state
        self._rng_after_reset = copy.deepcopy(rng_state)
        self._start(task)
        for action in actions:
            self.step(action)
        return self.current()

    def current(self) -> tuple[str, dict[str, Any]]:
        """The latest observation and info (after reset, step or restore)."""
        obs, info = self._last
        return obs, dict(info)

    # ----------------------------------------------------------------- hooks: snapshots
    def native_snapshot(self, resources: bool = True) -> Snapshot:
        """Hook: a ``NativeSnapshot`` (deep copies of ``base_state()`` and ``state_dict()``); override it for state that
        cannot be deep-copied (processes, handles). ``resources=False``: hold no OS resource (see ``snapshot``);
        a deep copy holds none either way."""
        return NativeSnapshot(self)

    def state_dict(self) -> dict[str, Any]:
        """Hook: the per-episode attributes that ``episode_fields`` names, for native snapshots."""
        return {name: getattr(self, name) for name in self.episode_fields}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Hook: set a ``state_dict()`` back on the env."""
        for name, value in state.items():
            setattr(self, name, value)

    # ----------------------------------------------------------------- plumbing: internals
    def _choose_task(self, options: Mapping[str, Any]) -> Task:
        if "task" in options:
            task = options["task"]
            if not isinstance(task, Task):
                raise ConfigError(f"expected options['task'] to be a trace_gym.Task, got {type(task).__name__}")
            return task
        if "task_id" in options:
            return self.task_by_id(str(options["task_id"]))
        if "index" in options:
            return self.tasks[int(options["index"]) % len(self.tasks)]
        return self.tasks[int(self.np_random.integers(len(self.tasks)))]

    def _start(self, task: Task) -> tuple[str, dict[str, Any]]:
        # Fresh messages before begin(): a begin() that does not set them must not serve the last episode's chat.
        self.task, self.turn_count, self._actions, self._done, self.messages = task, 0, [], False, []
        obs = self.begin(task)
        self._fingerprints = {k: fingerprint(v) for k, v in self._checked_fields().items()}
        info = self._with_base_info(self.reset_info())
        self._last = (obs, info)
        return obs, dict(info)

    def _checked_fields(self) -> dict[str, Any]:
        skip = {*self.episode_fields, *self.untracked_fields, *_BASE_FIELDS}
        return {k: v for k, v in vars(self).items() if not k.startswith("_") and k not in skip}

    def _check_untracked_state(self) -> None:
        """Raise if a public attribute changed during the episode without being an episode field."""
        now = {k: fingerprint(v) for k, v in self._checked_fields().items()}
        changed = sorted(k for k in now.keys() | self._fingerprints.keys()
                         if now.get(k, _MISSING) != self._fingerprints.get(k, _MISSING))
        if changed:
            raise SnapshotError(
                f"expected every attribute that changes during an episode to be declared, got {changed} changed "
                f"since begin() but not in {type(self).__name__}.episode_fields: a native snapshot would not "
                f"restore them; fix: add them to episode_fields (or to untracked_fields if they never affect "
                "observations or rewards)")

    def _with_base_info(self, info: dict[str, Any]) -> dict[str, Any]:
        assert self.task is not None
        info.update(task_id=self.task.id, turn=self.turn_count, messages=list(self.messages))
        return info


class ToolEnv(TextEnv):
    """A ReAct env: the model calls declared tools until it answers; ``verify`` scores the answer.

    **Hooks**: ``tools()``, ``verify()`` and a dataset (``load_tasks`` or ``tasks=``); optionally
    ``system_prompt`` / ``compact_prompt``, ``begin`` (call ``super().begin(task)``, which writes the system and
    user messages), ``example_actions`` and ``expert``. A tool raises ``ToolError`` for the model's mistakes;
    any other exception from it propagates out of ``step``. **Plumbing**: ``turn`` parses the action, runs the
    calls (at most ``max_tool_calls``) and scores an answer; override it only to read a turn another way first,
    then delegate to ``super().turn(action)`` (as the math envs do for ``\\boxed{}`` answers).
    """

    system_prompt: str = "You are a helpful assistant that solves the task step by step, using tools."
    """The task's instructions. ``system_message()`` appends the tool instructions to it (see
    ``tool_instructions``)."""
    native_prompt: str | None = None
    """The task's instructions for a model that calls the tools natively, when they differ from ``system_prompt``
    (one that names the text format's answer tag, say); ``native_system_message()`` uses it."""
    compact_prompt: str | None = None
    """The whole system message in the tag format, when set: small models pay for every prompt token of every
    episode, and the generic tool instructions can be most of an episode's tokens."""
    tool_instructions: bool = True
    """Whether ``system_message()`` appends the parser's instructions for the declared tools to ``system_prompt``
    (in the text formats: the tools' schemas and how to write a call and an answer). False sends ``system_prompt``
    as written, for a prompt that already says it all or a chat template that renders the tools itself; the
    constructor's ``tool_instructions=`` sets it per env."""

    def __init__(self, tasks: Sequence[Task] | None = None, max_turns: int = 8, parser: ActionParser | None = None,
                 max_tool_calls: int = 4, max_result_chars: int = 8000, tool_instructions: bool | None = None,
                 **kwargs: Any):
        """``max_tool_calls``: calls run per turn; the rest are answered ``Error: not run: ...``, so that a turn
        costs at most this many times the slowest tool's own bound (a 32k-character action holds hundreds of
        calls). ``max_result_chars``: each call's result is cut there, with a note. ``tool_instructions``:
        overrides the class attribute of that name."""
        if max_tool_calls < 1:
            raise ConfigError(f"expected max_tool_calls >= 1, got {max_tool_calls}")
        if max_result_chars < 1:
            raise ConfigError(f"expected max_result_chars >= 1, got {max_result_chars}")
        super().__init__(tasks=tasks, max_turns=max_turns, **kwargs)
        self.parser: ActionParser = parser or HermesParser()
        self.max_tool_calls = max_tool_calls
        self.max_result_chars = max_result_chars
        if tool_instructions is not None:
            self.tool_instructions = bool(tool_instructions)

    # ----------------------------------------------------------------- hooks
    def tools(self) -> Sequence[Tool]:
        """Hook: the tools the model may call (e.g. ``[Tool.from_function(self.lookup)]``); none by default."""
        return []

    def verify(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        """Hook (required): score the final ``answer`` to ``task``: ``(reward, details)``; ``details`` join the last
        step's ``info``."""
        raise NotImplementedError(f"{type(self).__name__} must implement verify(task, answer)")

    # ----------------------------------------------------------------- plumbing (extend with super(), if at all)
    @cached_property
    def tool_map(self) -> dict[str, Tool]:
        """``tools()`` by name (computed once per env)."""
        return {t.name: t for t in self.tools()}

    def system_message(self) -> str:
        """The system prompt followed by the parser's instructions for the declared tools (or, in the tag format,
        ``compact_prompt`` when the env has one); ``system_prompt`` alone without ``tool_instructions``."""
        if not self.tool_instructions:
            return self.system_prompt
        if self.compact_prompt is not None and isinstance(self.parser, TagParser):
            return self.compact_prompt
        return self.system_prompt + "\n\n" + self.parser.instructions(list(self.tool_map.values()))

    def native_system_message(self) -> str:
        """The system message for a model that calls the tools natively (the OpenAI ``tools`` field, whose schemas
        the server renders): ``system_message()`` with the text format's tool instructions replaced by
        `NATIVE_INSTRUCTIONS`, which say that a reply without a tool call is the final answer. What a subclass adds
        around the base's message is kept."""
        text = self.system_message()
        if self.tool_instructions:
            instructions = self.parser.instructions(list(self.tool_map.values()))
            if instructions in text:
                text = text.replace(instructions, NATIVE_INSTRUCTIONS, 1)
            else:  # the compact prompt teaches the tag format
                text = self.system_prompt + "\n\n" + NATIVE_INSTRUCTIONS
        if self.native_prompt is not None:
            text = text.replace(self.system_prompt, self.native_prompt, 1)
        return text

    def begin(self, task: Task) -> str:
        """Start ``task`` with the system message (``system_message()``) and the task prompt."""
        self.messages = [{"role": "system", "content": self.system_message()}, {"role": "user", "content": task.prompt}]
        return task.prompt

    def reset_info(self) -> dict[str, Any]:
        """``{"tools": [...]}``: the JSON schemas of the tools, for chat templates that render them."""
        return {"tools": [t.schema() for t in self.tool_map.values()]}

    def turn(self, action: str) -> Turn:
        """Parse ``action`` with the env's parser: an answer is scored by ``verify`` and ends the episode; a
        malformed action gets one error observation. Tool calls run in order, each answered in its own tool message
        (its result, or ``Error: ...`` for a call that failed, while the others still run: a model that sent one
        bad call among good ones sees which); the observation joins them, and ``info["error"]`` joins the errors."""
        parsed = self.parser.parse(action, self.tool_map)
        if parsed.error is not None:
            return Turn(f"Error: {parsed.error}", info={"error": parsed.error})
        if parsed.answer is not None:
            assert self.task is not None
            reward, verdict = self.verify(self.task, parsed.answer)
            info: dict[str, Any] = {**verdict, "answer": parsed.answer, "stop_reason": "answer"}
            return Turn("", reward=reward, terminated=True, info=info, messages=[])
        results, errors = [], []
        for call in parsed.calls[: self.max_tool_calls]:
            text, error = call_tool(self.tool_map, call, max_chars=self.max_result_chars)
            results.append(text)
            if error:
                errors.append(error)
        excess = len(parsed.calls) - len(results)
        if excess > 0:  # one message per call still, so that native tool calls each get their reply
            over = f"not run: over the limit of {self.max_tool_calls} tool calls per turn"
            results += [f"Error: {over}"] + ["Error: not run"] * (excess - 1)
            errors.append(f"{excess} calls {over}")
        info = {"tool_calls": len(parsed.calls)}
        if errors:
            info["error"] = "; ".join(errors)
        return Turn("\n\n".join(results), info=info,
                    messages=[{"role": "tool", "name": c.name, "content": r} for c, r in zip(parsed.calls, results)])
