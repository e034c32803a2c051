"""BFCL v4 environments: executable multi-turn categories and single-turn AST categories.

Multi-turn episode: the user turns of a BFCL entry come in order. Each step the model either calls functions
(Hermes `<tool_call>` blocks or a BFCL Python-call list; several per step) and sees their results, or replies
without a call, which ends the user turn: BFCL's verdict for that turn is taken and the next user message is
the observation. After the last turn the episode terminates with reward 1 iff every turn passed.

Where this deviates from BFCL's inference loop (bfcl_eval/model_handler/base_handler.py), and why:
1. A turn that attempts calls but cannot be decoded (bad JSON, a non-literal argument, a callee that is not a
   name) gets an error observation and the user turn goes on; BFCL ends the user turn on a decode failure.
   An RL env should let the model fix a malformed call (docs/design.md: model mistakes are error observations).
2. Calls run by direct method lookup on the entry's backend instances, after a jsonschema check of argument
   names, required arguments and enums (types are left to the backend, as BFCL's eval does); nothing is
   eval-ed. As in BFCL, a miss_func held-out function is hidden from the prompt but still callable: BFCL's
   own ground truth calls one before its reveal (multi_turn_miss_func_49 calls `tail` in turn 1).
3. The per-turn step limit (BFCL's MAXIMUM_STEP_LIMIT, 20) ends the episode with reward 0, as BFCL's
   force-quit fails the entry; error-only steps count towards it.
4. A step is bounded whatever the model writes (BFCL bounds none of this): at most ``max_calls_per_step`` (8)
   calls run, sharing ``step_time_s`` (10 s; each call at most ``CALL_BOUND.timeout_s``, 5 s); later calls are
   answered ``Error: not run: ...`` and may be made in the next step; each result is cut at
   ``max_result_chars`` (40,000 characters, above the longest of the ground truth). So a step takes at most
   about 10 s and its observation holds at most about 320,000 characters.
Single-turn episode: one step; the answer's calls go to bfcl_eval's ast_checker (irrelevance: right iff no
call). Left out: web_search (network), memory (the vector backend loads a hub model), Java/JavaScript, live.
"""

from __future__ import annotations

import copy
import json
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from trace_gym.env import TextEnv, Turn
from trace_gym.environments.bfcl import backends, checker
from trace_gym.environments.bfcl.calls import BadCall, Call, Decoded, decode, parse_ground_truth_call, to_python_call
from trace_gym.environments.bfcl.data import (
    MULTI_TURN_CATEGORIES,
    SINGLE_TURN_CATEGORIES,
    Split,
    entry_functions,
    load_entries,
    split_ids,
)
from trace_gym.environments.bfcl.expert import BFCLExpert
from trace_gym.environments.bfcl.schema import tool_schema
from trace_gym.errors import ConfigError
from trace_gym.tasks import Task

MAX_STEPS_PER_TURN = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT
_MIN_CALL_S = 0.05  # below this a bounded call cannot even start its child
ADDITIONAL_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"

CALL_FORMAT = """To call functions, write one or more blocks
<tool_call>
{"name": <function name>, "arguments": {<argument name>: <value>, ...}}
</tool_call>
or a Python list of calls with keyword arguments, e.g. [func_a(x=1, y='b'), func_b()].
Write nothing else in a turn that calls functions. Function results come back as the next message."""

MULTI_TURN_SYSTEM = ("You are an expert in composing functions. You are given a question and a set of possible "
                     "functions. Based on the question, make one or more function calls to achieve the purpose; "
                     "you may call functions over several steps and see their results. When the request is "
                     "fulfilled, or cannot be fulfilled with the given functions or without a missing parameter, "
                     "reply in plain text without a function call; the user then continues.\n\n" + CALL_FORMAT)

SINGLE_TURN_SYSTEM = ("You are an expert in composing functions. You are given a question and a set of possible "
                      "functions. Based on the question, make the function call(s) that answer it, all in one "
                      "reply. If none of the functions can be used, reply in plain text without a call.\n\n"
                      + CALL_FORMAT)


def _shown(call: Call) -> str:
    """A call as the tool message names it (its BFCL Python form, cut at 200 characters)."""
    try:
        return to_python_call(call)[:200]
    except ValueError:  # repr of an integer too long to print (a hex literal in the Python-call form)
        return call.name[:200]


def _tools_text(docs: Sequence[Mapping[str, Any]]) -> str:
    return "<tools>\n" + "\n".join(json.dumps(tool_schema(dict(d))) for d in docs) + "\n</tools>"


def _user_content(messages: Sequence[Mapping[str, Any]]) -> str:
    return "\n\n".join(str(m["content"]) for m in messages if m.get("role") == "user")


def multi_turn_tasks(category: str, split: Split) -> list[Task]:
    """One task per BFCL multi-turn entry of `category` in `split` (answer = ground-truth call strings)."""
    entries = {e["id"]: e for e in load_entries(category)}
    tasks = []
    for entry_id in split_ids(list(entries), split):
        e = entries[entry_id]
        meta = {"category": category, "question": e["question"], "initial_config": e["initial_config"],
                "involved_classes": e["involved_classes"], "missed_function": e.get("missed_function", {})}
        tasks.append(Task(entry_id, _user_content(e["question"][0]), e["ground_truth"], meta))
    return tasks


def single_turn_tasks(category: str, split: Split = "all") -> list[Task]:
    entries = {e["id"]: e for e in load_entries(category)}
    return [Task(i, _user_content(entries[i]["question"][0]), entries[i].get("ground_truth"),
                 {"category": category, "question": entries[i]["question"], "function": entries[i]["function"]})
            for i in split_ids(list(entries), split)]


class _GroundTruth:
    """Per user turn: the ground-truth instances after that turn and its call results (derived from the task,
    so kept outside the snapshotted episode state)."""

    def __init__(self, task: Task, long_context: bool):
        entry = {"involved_classes": task.meta["involved_classes"], "initial_config": task.meta["initial_config"]}
        instances = backends.make_instances(entry, long_context)
        owners = backends.method_owners(instances)
        docs = {d["name"]: d for d in entry_functions(entry)[0]}  # every function: revealed ones included
        validators = backends.Validators()
        self.states: list[dict[str, Any]] = []
        self.results: list[list[str]] = []
        for calls in task.answer:
            results = [backends.execute(instances, owners, docs, validators, parse_ground_truth_call(c),
                                        bounded=False)[0]
                       for c in calls]
            self.results.append(results)
            self.states.append(copy.deepcopy(instances))


class BFCLMultiTurnEnv(TextEnv):
    """Executable BFCL multi-turn entries; reward = BFCL's multi-turn verdict (binary, at episode end)."""

    episode_fields = ("instances", "visible", "turn_index", "steps_in_turn", "calls_in_turn", "model_results",
                      "verdicts")

    def __init__(self, category: str = "multi_turn_base", split: Split = "train", max_turns: int = 200,
                 tasks: Sequence[Task] | None = None, strict_types: bool = False,
                 max_calls_per_step: int = backends.MAX_CALLS_PER_STEP, step_time_s: float = backends.STEP_TIME_S,
                 max_result_chars: int = backends.MAX_RESULT_CHARS, **kwargs: Any):
        """``max_calls_per_step``: calls run per step, the rest answered ``Error: not run``; ``step_time_s``: the
        calls of one step share this many seconds (each is also bounded by ``backends.CALL_BOUND``); a call's
        result is cut at ``max_result_chars``. See the module docstring, point 4."""
        if category not in MULTI_TURN_CATEGORIES:
            raise ConfigError(f"expected a multi-turn category in {MULTI_TURN_CATEGORIES}, got {category!r}")
        if max_calls_per_step < 1 or step_time_s <= 0 or max_result_chars < 1:
            raise ConfigError(f"expected max_calls_per_step >= 1, step_time_s > 0 and max_result_chars >= 1, got "
                              f"{max_calls_per_step}, {step_time_s} and {max_result_chars}")
        backends.require_bfcl_eval()
        super().__init__(tasks=tasks, max_turns=max_turns, **kwargs)
        self.max_calls_per_step, self.step_time_s = max_calls_per_step, step_time_s
        self.max_result_chars = max_result_chars
        self.category, self.split = category, split
        self.long_context = "long_context" in category
        self.validators = backends.Validators(strict_types=strict_types)
        self._ground_truth: OrderedDict[str, _GroundTruth] = OrderedDict()
        self._doc_cache: dict[str, tuple[dict[str, dict[str, Any]], dict[int, list[dict[str, Any]]]]] = {}
        self._owner_cache: dict[tuple[str, ...], dict[str, str]] = {}
        self.instances: dict[str, Any] = {}
        self.visible: list[str] = []
        self.turn_index = self.steps_in_turn = self.calls_in_turn = 0
        self.model_results: list[str] = []
        self.verdicts: list[dict[str, Any]] = []

    def load_tasks(self) -> Sequence[Task]:
        return multi_turn_tasks(self.category, self.split)

    # ----------------------------------------------------------------- helpers
    def _docs(self, task: Task) -> tuple[dict[str, dict[str, Any]], dict[int, list[dict[str, Any]]]]:
        """(every function doc by name, {turn: docs revealed then}); derived from the task, so cached."""
        cached = self._doc_cache.get(task.id)
        if cached is None:
            visible, held = entry_functions({"involved_classes": task.meta["involved_classes"],
                                             "missed_function": task.meta["missed_function"]})
            every = {d["name"]: d for d in visible} | {d["name"]: d for ds in held.values() for d in ds}
            cached = self._doc_cache[task.id] = (every, held)
        return cached

    def _owners(self) -> dict[str, str]:
        key = tuple(self.instances)
        owners = self._owner_cache.get(key)
        if owners is None:
            owners = self._owner_cache[key] = backends.method_owners(self.instances)
        return owners

    def ground_truth(self, task: Task) -> _GroundTruth:
        gt = self._ground_truth.get(task.id)
        if gt is None:
            gt = self._ground_truth[task.id] = _GroundTruth(task, self.long_context)
            if len(self._ground_truth) > 4:
                self._ground_truth.popitem(last=False)
        self._ground_truth.move_to_end(task.id)
        return gt

    def tool_schemas(self) -> list[dict[str, Any]]:
        assert self.task is not None
        every, _ = self._docs(self.task)
        return [tool_schema(every[name]) for name in self.visible]

    # ----------------------------------------------------------------- hooks
    def begin(self, task: Task) -> str:
        every, held = self._docs(task)
        hidden = {d["name"] for ds in held.values() for d in ds}
        self.instances = backends.make_instances(task.meta, self.long_context)
        backends.warm_call_server(list(self.instances))
        self.visible = [name for name in every if name not in hidden]
        self.turn_index = self.steps_in_turn = self.calls_in_turn = 0
        self.model_results, self.verdicts = [], []
        system = MULTI_TURN_SYSTEM + "\n\n" + _tools_text([every[n] for n in self.visible])
        self.messages = [{"role": "system", "content": system}, *task.meta["question"][0]]
        return _user_content(task.meta["question"][0])

    def reset_info(self) -> dict[str, Any]:
        return {"tools": self.tool_schemas(), "user_turn": 0}

    def turn(self, action: str) -> Turn:
        decoded = decode(action)
        self.steps_in_turn += 1
        if decoded.format == "none":
            return self._end_user_turn()
        return self._run_calls(decoded)

    def _run_calls(self, decoded: Decoded) -> Turn:
        assert self.task is not None
        docs, _ = self._docs(self.task)
        owners = self._owners()
        results, messages, errors = [], [], []
        deadline, ran, over = time.monotonic() + self.step_time_s, 0, False
        for item in decoded.items:
            if isinstance(item, BadCall):
                text, ok, shown = f"Error: {item.error}", False, item.text
            elif ran >= self.max_calls_per_step:
                text = (f"Error: not run: over the limit of {self.max_calls_per_step} function calls per step; "
                        "make it in the next step") if not over else "Error: not run"
                ok, shown, over = False, _shown(item), True
            elif (left := deadline - time.monotonic()) <= _MIN_CALL_S:
                text, ok, shown = (f"Error: not run: this step's calls took its {self.step_time_s:g} s; make it "
                                   "in the next step", False, _shown(item))
            else:
                ran += 1
                text, ok = backends.execute(self.instances, owners, docs, self.validators, item, timeout_s=left,
                                            max_chars=self.max_result_chars)
                self.model_results.append(text)
                shown = _shown(item)
            if not ok:
                errors.append(text)
            results.append((shown, text))
            messages.append({"role": "tool", "name": shown, "content": text})
        if decoded.calls:
            self.calls_in_turn += 1
        observation = results[0][1] if len(results) == 1 else "\n\n".join(f"{s}:\n{t}" for s, t in results)
        info: dict[str, Any] = {"tool_calls": len(decoded.calls), "user_turn": self.turn_index}
        if errors:
            info["error"] = "; ".join(errors)
        if self.steps_in_turn > MAX_STEPS_PER_TURN:  # BFCL force-quits and fails the entry
            info |= {"stop_reason": "step_limit", "verdicts": list(self.verdicts)}
            return Turn(observation, reward=0.0, terminated=True, info=info, messages=messages)
        return Turn(observation, info=info, messages=messages)

    def _end_user_turn(self) -> Turn:
        assert self.task is not None
        gt = self.ground_truth(self.task)
        t = self.turn_index
        verdict = checker.check_turn(t, self.calls_in_turn > 0, self.instances, gt.states[t], self.model_results,
                                     gt.results[t], self.task.answer[t])
        self.verdicts.append(verdict)
        info: dict[str, Any] = {"turn_verdict": verdict, "user_turn": t}
        questions = self.task.meta["question"]
        if t + 1 >= len(questions):
            passed = all(v["valid"] for v in self.verdicts)
            info |= {"stop_reason": "answer", "verdicts": list(self.verdicts), "passed_turns":
                     sum(v["valid"] for v in self.verdicts)}
            return Turn("", reward=float(passed), terminated=True, info=info, messages=[])
        self.turn_index, self.steps_in_turn, self.calls_in_turn = t + 1, 0, 0
        user = list(questions[t + 1])
        revealed = self._docs(self.task)[1].get(t + 1, [])
        if revealed:  # miss_func: the held-out function comes back with BFCL's own follow-up message
            self.visible += [d["name"] for d in revealed]
            user = [{"role": "user", "content": ADDITIONAL_FUNCTIONS_PROMPT + "\n" + _tools_text(revealed)}]
            info["tools"] = self.tool_schemas()
        return Turn(_user_content(user), info=info, messages=user)

    def expert(self, noise: float = 0.0, seed: int = 0) -> BFCLExpert:
        """The scripted ground-truth player for this env's tasks (trace_gym.experts.Expert protocol)."""
        return BFCLExpert(noise=noise, seed=seed, max_calls_per_step=self.max_calls_per_step)

    def example_actions(self) -> list[str]:
        if self.task is None:
            return []
        calls = [c for turn in self.task.answer for c in turn]
        return [f"[{c}]" for c in calls[:4]] + ["Done."]


class BFCLSingleTurnEnv(TextEnv):
    """BFCL single-turn AST categories: one step, reward = bfcl_eval's ast_checker verdict."""

    def __init__(self, category: str = "simple_python", split: Split = "all", tasks: Sequence[Task] | None = None,
                 **kwargs: Any):
        if category not in SINGLE_TURN_CATEGORIES:
            raise ConfigError(f"expected a single-turn category in {SINGLE_TURN_CATEGORIES}, got {category!r}")
        backends.require_bfcl_eval()
        kwargs.setdefault("max_turns", 1)
        super().__init__(tasks=tasks, **kwargs)
        self.category, self.split = category, split

    def load_tasks(self) -> Sequence[Task]:
        return single_turn_tasks(self.category, self.split)

    def begin(self, task: Task) -> str:
        system = SINGLE_TURN_SYSTEM + "\n\n" + _tools_text(task.meta["function"])
        self.messages = [{"role": "system", "content": system}, *task.meta["question"][0]]
        return _user_content(task.meta["question"][0])

    def reset_info(self) -> dict[str, Any]:
        assert self.task is not None
        return {"tools": [tool_schema(d) for d in self.task.meta["function"]]}

    def turn(self, action: str) -> Turn:
        assert self.task is not None
        decoded = decode(action)
        if self.category == "irrelevance":
            verdict = checker.irrelevance_verdict(bool(decoded.items))
        elif decoded.errors:
            verdict = {"valid": False, "error": [e.error for e in decoded.errors],
                       "error_type": "ast_decoder:decoder_failed"}
        else:
            verdict = checker.ast_verdict(self.category, self.task.meta["function"], decoded.calls,
                                          self.task.answer)
        info = {"verdict": verdict, "stop_reason": "answer", "tool_calls": len(decoded.calls)}
        if decoded.errors:
            info["error"] = "; ".join(e.error for e in decoded.errors)
        return Turn("", reward=float(verdict["valid"]), terminated=True, info=info, messages=[])

    def expert(self, noise: float = 0.0, seed: int = 0) -> BFCLExpert:
        """The scripted ground-truth player for this env's tasks (trace_gym.experts.Expert protocol)."""
        return BFCLExpert(noise=noise, seed=seed)

    def example_actions(self) -> list[str]:
        return ["[]", "I cannot help with that."]
