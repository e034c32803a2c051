"""Math environments: the model solves a problem with a persistent, sandboxed Python tool and answers.

``MathEnv(dataset=...)`` serves GSM8K, MATH-500, AIME 2024, AMC 2023 and a DeepScaleR-style training mix
(AIME 1983-2023 + MATH train, the parts of DeepScaleR obtainable offline) from bundled data, a user's data
(``data_path=``: a JSON/JSONL/CSV file, a ``datasets.Dataset`` or a list of records) or the hub
(``from_hub=True``, needs the ``datasets`` package and a network). A record needs a problem and an answer
under one of the usual names (``problem``/``question``/``prompt``, ``answer``/``final_answer``/
``expected_answer``/``ground_truth``), case-insensitive; ``fields={"problem": "my_col"}`` maps any other.
``ArithmeticEnv`` is the procedural family for the CPU quickstart.

Actions: ``action_format="hermes"`` (``<tool_call>{"name": "python", "arguments": {"code": ...}}</tool_call>``,
the default of ``MathEnv``: the format Qwen3 and other chat models are trained to emit) or ``"tags"``
(``<python>code</python>``, ``<answer>..</answer>``, the default of ``ArithmeticEnv``: a one-line prompt and
short episodes for the byte-level tiny model of the quickstart). ``MathEnv``'s prompt asks for the final answer
in ``<answer>`` or as ``\\boxed{...}``: a turn without a tool call whose last ``\\boxed{}`` holds the answer is
read as the answer, as math-tuned models write it. A native snapshot is the env state plus a frozen fork of the
sandbox; a replay snapshot re-executes the cells.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from trace_gym.actions import ActionParser, HermesParser, ParsedAction, TagParser
from trace_gym.env import ToolEnv, Turn
from trace_gym.environments.math.answers import check_answer, format_gold, gsm8k_gold, last_boxed
from trace_gym.environments.math.arithmetic import ArithmeticConfig, make_tasks, make_tiered_tasks, parse_tiers
from trace_gym.environments.records import Fields, Source, check_fields, find_column, read_records
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, SandboxSnapshot
from trace_gym.errors import ConfigError, DataError, SetupError
from trace_gym.limits import Footprint
from trace_gym.snapshot import NativeSnapshot, Restorable
from trace_gym.tasks import Task
from trace_gym.tools import Tool, ToolCall

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "math"
# dataset -> bundled files (relative to DATA_DIR), hub id, hub config, hub split
DATASETS: dict[str, tuple[tuple[str, ...], str, str | None, str]] = {
    "gsm8k": (("gsm8k/test.jsonl",), "openai/gsm8k", "main", "test"),
    "gsm8k_train": (("gsm8k/train.jsonl",), "openai/gsm8k", "main", "train"),
    "math500": (("math500/test.json",), "HuggingFaceH4/MATH-500", None, "test"),
    "aime24": (("aime2024/test.json",), "HuggingFaceH4/aime_2024", None, "train"),
    "amc23": (("amc2023/amc23_test.jsonl",), "math-ai/amc23", None, "test"),
    "deepscaler": (("deepscaler_train/aime_1983_2023.json", "deepscaler_train/math_train.json"),
                   "agentica-org/DeepScaleR-Preview-Dataset", None, "train"),
}
SYSTEM_PROMPT = ("Solve the math problem. You can run Python with the python tool: variables, functions and "
                 "imports persist between calls, and math, numpy (np), sympy (sp) and fractions are already "
                 "imported. Print what you need to see. Give only the final answer (a number or a LaTeX "
                 "expression) inside <answer></answer>, or as \\boxed{answer} in a reply without a tool call.")
NATIVE_PROMPT = SYSTEM_PROMPT[: SYSTEM_PROMPT.index(" Give only")] + (
    " Give only the final answer (a number or a LaTeX expression), as \\boxed{answer} or alone.")
# The loader's field names and the column names each is found under (compared without case, '_' or spaces).
FIELD_NAMES: dict[str, tuple[str, ...]] = {
    "problem": ("problem", "question", "prompt", "input"),
    "answer": ("answer", "final_answer", "expected_answer", "ground_truth", "target"),
    "id": ("unique_id", "id", "idx", "problem_idx", "problem_id"),
}


def record_to_task(rec: Mapping[str, Any], task_id: str, where: str = "the data") -> Task:
    """A problem record in any of the supported formats (GSM8K, MATH, AIME, AMC, DeepScaleR, {prompt, answer},
    ...) -> Task."""
    pcol, acol = find_column(rec, FIELD_NAMES["problem"]), find_column(rec, FIELD_NAMES["answer"])
    prompt = rec[pcol] if pcol is not None else None
    answer = rec[acol] if acol is not None else None
    if not isinstance(prompt, str) or answer is None:
        raise DataError(f"expected a record with a problem ({'/'.join(FIELD_NAMES['problem'])}) and an answer "
                        f"({'/'.join(FIELD_NAMES['answer'])}) in {where}, got keys {sorted(rec)}; fix: pass "
                        "fields={'problem': <your column>, 'answer': <your column>}")
    gold = gsm8k_gold(answer) if isinstance(answer, str) and "####" in answer else format_gold(answer)
    meta = {k: rec[k] for k in ("difficulty", "type", "year", "url", "level", "subject") if k in rec}
    icol = find_column(rec, FIELD_NAMES["id"])
    tid = str(rec[icol]) if icol is not None and str(rec[icol]) else task_id
    return Task(id=tid, prompt=prompt, answer=gold, meta=meta)


def _answer_column(rec: Mapping[str, Any]) -> Any:
    col = find_column(rec, FIELD_NAMES["answer"])
    return rec[col] if col is not None else 0


def load_math_tasks(dataset: str = "math500", data_path: Source | None = None, from_hub: bool = False,
                    fields: Fields | None = None) -> list[Task]:
    """Tasks of ``dataset`` from ``data_path`` (a JSON array, JSONL or CSV file, a ``datasets.Dataset`` or a
    list of records), the bundled copy, or the hub; ``fields`` maps the loader's names to other columns."""
    if dataset not in DATASETS:
        raise ConfigError(f"expected dataset in {sorted(DATASETS)}, got {dataset!r}")
    check_fields(fields, tuple(FIELD_NAMES), "math data")
    files, hub_id, hub_config, hub_split = DATASETS[dataset]
    if data_path is not None:
        where = str(data_path) if isinstance(data_path, str | os.PathLike) else type(data_path).__name__
        stem = Path(data_path).stem if isinstance(data_path, str | os.PathLike) else "records"
        sources = [(stem, where, read_records(data_path, fields))]
    elif from_hub:
        try:
            import datasets  # optional; only when the user asks for the hub
        except ImportError:
            raise SetupError("expected the datasets package for from_hub=True, got ImportError; fix: pip install "
                             "datasets, or pass data_path= to a local file") from None
        ds = datasets.load_dataset(hub_id, hub_config, split=hub_split)
        sources = [(hub_id.split("/")[-1], hub_id, read_records(ds, fields, hub_id))]
    else:
        sources = [(Path(f).stem, f, read_records(DATA_DIR / f)) for f in files]
    tasks, seen = [], set()
    for stem, where, recs in sources:
        for i, rec in enumerate(recs):
            if _answer_column(rec) in (None, ""):
                continue  # a few MATH-train records have no extracted answer
            task = record_to_task(rec, f"{dataset}-{stem}-{i}", f"{where} record {i}")
            if task.id in seen:  # ids must be unique within the dataset
                task = Task(f"{dataset}-{stem}-{i}", task.prompt, task.answer, task.meta)
            seen.add(task.id)
            tasks.append(task)
    return tasks


def python_call(code: str) -> ToolCall:
    """A call of the python tool."""
    return ToolCall("python", {"code": code})


def boxed_answer(parsed: ParsedAction, text: str) -> str | None:
    """The ``\\boxed{}`` answer of a turn that holds no tool call and no ``<answer>``; None otherwise."""
    if parsed.calls or parsed.answer is not None or "<tool_call>" in text or "<python>" in text:
        return None
    boxed = last_boxed(text)
    return boxed.strip() if boxed is not None and boxed.strip() else None


def python_tool(sandbox: PythonSandbox) -> Tool:
    def python(code: str) -> str:
        result = sandbox.run(code)
        return result.output if result.output.strip() else "[no output: print() what you want to see]"

    return Tool(name="python",
                description="Run Python code in a persistent session and return what it prints (and the value "
                            "of the last expression).",
                parameters={"type": "object", "properties": {"code": {"type": "string",
                            "description": "Python code to run"}}, "required": ["code"]},
                fn=python)


def make_parser(action_format: str) -> ActionParser:
    if action_format == "tags":
        return TagParser()
    if action_format == "hermes":
        return HermesParser()
    raise ConfigError(f"expected action_format 'tags' or 'hermes', got {action_format!r}")


class MathSnapshot(NativeSnapshot):
    """Env state plus a frozen fork of the sandbox worker (``fork=False``, or once released: the sandbox's cell
    list only, re-run in a new lineage at the first cell after a restore)."""

    def __init__(self, env: MathEnv, fork: bool = True):
        super().__init__(env)
        self.sandbox: SandboxSnapshot = env.sandbox.snapshot(native=fork)

    def restore_into(self, env: Restorable) -> tuple[str, dict[str, Any]]:
        out = super().restore_into(env)
        assert isinstance(env, MathEnv)
        env.sandbox.restore(self.sandbox)
        return out

    def release(self) -> None:
        self.sandbox.release()


class MathEnv(ToolEnv):
    """A math problem, a Python tool, an answer checked by math-verify/sympy. Binary reward."""

    system_prompt = SYSTEM_PROMPT
    native_prompt = NATIVE_PROMPT
    boxed_answers = True
    """Whether a turn without a tool call that writes ``\\boxed{...}`` answers (the prompt says so)."""

    @staticmethod
    def host_footprint(branching: bool) -> Footprint:
        """Per trajectory at a step's peak (trace_gym.limits): benchmarks/scale.py's figures on three-cell episodes
        (docs/scale.md: 2.0 processes, 2.5 descriptors, 4.7-5.5 MB branching; 0.12, 0.2-0.3, 0.4-1.0 MB flat), plus
        the cell process each idle worker forks ahead (one process and about 1.4 MB per live worker: 0.19
        processes per trajectory flat), with half again as margin."""
        if branching:
            return Footprint(processes=4.5, descriptors=4.0, namespaces=1.0, memory_bytes=11 << 20)
        return Footprint(processes=0.3, descriptors=0.5, namespaces=0.25, memory_bytes=2 << 20)

    def __init__(self, dataset: str = "math500", data_path: Source | None = None, from_hub: bool = False,
                 fields: Fields | None = None, tasks: Sequence[Task] | None = None,
                 action_format: Literal["tags", "hermes"] = "hermes", max_turns: int = 8,
                 limits: SandboxLimits | None = None, sandbox_user: str | None = "nobody",
                 sandbox_isolation: str = "jail", **kwargs: Any):
        super().__init__(tasks=tasks, max_turns=max_turns, parser=make_parser(action_format), **kwargs)
        if dataset not in DATASETS:
            raise ConfigError(f"expected dataset in {sorted(DATASETS)}, got {dataset!r}")
        check_fields(fields, tuple(FIELD_NAMES), "math data")
        self.dataset, self.data_path, self.from_hub = dataset, data_path, from_hub
        self.fields = dict(fields or {})
        self.action_format = action_format
        self.sandbox = PythonSandbox(limits, user=sandbox_user, isolation=sandbox_isolation)

    def load_tasks(self) -> Sequence[Task]:
        return load_math_tasks(self.dataset, self.data_path, self.from_hub, self.fields or None)

    def turn(self, action: str) -> Turn:
        if self.boxed_answers:
            boxed = boxed_answer(self.parser.parse(action, self.tool_map), action)
            if boxed is not None:
                assert self.task is not None
                reward, verdict = self.verify(self.task, boxed)
                info = {**verdict, "answer": boxed, "stop_reason": "answer"}
                return Turn("", reward=reward, terminated=True, info=info, messages=[])
        return super().turn(action)

    def tools(self) -> Sequence[Tool]:
        return [python_tool(self.sandbox)]

    def begin(self, task: Task) -> str:
        self.sandbox.reset()
        return super().begin(task)

    def verify(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return check_answer(answer, task.answer, isolation=self.sandbox.isolation, user=self.sandbox.user)

    def native_snapshot(self, resources: bool = True) -> MathSnapshot:
        return MathSnapshot(self, fork=resources)

    def example_actions(self) -> list[str]:
        cells = ["x = 6 * 7\nprint(x)", "x = x + 1\nx", "import sympy as sp\nprint(sp.factorint(360))",
                 "print(undefined_name)"]
        answer = str(self.task.answer) if self.task is not None else "0"
        return [self.parser.format(python_call(c)) for c in cells] + [self.parser.format_answer(answer),
                                                                        self.parser.format_answer("-1")]

    def expert(self, noise: float = 0.0, seed: int = 0) -> Any:
        from trace_gym.environments.math.experts import MathExpert

        return MathExpert(self.action_format, noise=noise, seed=seed)

    def close(self) -> None:
        self.sandbox.close()
        super().close()


class ArithmeticEnv(MathEnv):
    """Procedural arithmetic and word problems (``trace/Arithmetic-v0``), solvable with one tool call. Tag format
    by default: the quickstart's tiny model learns it from a one-line prompt."""

    system_prompt = ("Compute the answer. Run Python with the python tool, read the output, then reply "
                     "<answer>the number</answer>.")
    # Every token of it is in every episode the tiny model trains on (a third of an episode with the longer
    # "Run <python>print(expression)</python>, then reply <answer>the number</answer>.").
    native_prompt = "Compute the answer. Run Python with the python tool, read the output, then reply with the number."
    compact_prompt = "Use <python>, then <answer>."
    boxed_answers = False  # the prompt asks for <answer> only

    def __init__(self, difficulty: int | None = None, config: ArithmeticConfig | Mapping[str, Any] | None = None,
                 n_tasks: int = 2000, task_seed: int = 0, max_turns: int = 4, word_fraction: float | None = None,
                 action_format: Literal["tags", "hermes"] = "tags",
                 tiers: Mapping[str, Mapping[str, Any]] | None = None, **kwargs: Any):
        ignored = sorted(set(kwargs) & {"dataset", "data_path", "from_hub", "fields"})
        if ignored:  # MathEnv's data settings: Arithmetic generates its tasks, it would drop them silently
            raise ConfigError(f"expected no {', '.join(ignored)} for trace/Arithmetic-v0 (it generates its tasks), "
                              f"got {', '.join(f'{k}={kwargs[k]!r}' for k in ignored)}; fix: set n_tasks, task_seed, "
                              "difficulty or config, or use trace/Math-v0 for a data file")
        super().__init__(dataset="math500", max_turns=max_turns, action_format=action_format, **kwargs)
        if sum(x is not None for x in (difficulty, config, tiers)) > 1:
            raise ConfigError("expected one of difficulty, config and tiers, got more; pass one")
        if isinstance(config, Mapping):  # from YAML or gym.make: {min_ops: 1, max_ops: 6, ...}
            known = {f.name for f in dataclasses.fields(ArithmeticConfig)}
            if set(config) - known:
                raise ConfigError(f"expected config keys among {sorted(known)}, got {sorted(set(config) - known)}")
            config = ArithmeticConfig(**config)
        self.config = ArithmeticConfig.level(difficulty) if difficulty is not None else (config or ArithmeticConfig())
        if word_fraction is not None:  # settable from YAML/gym.make without building an ArithmeticConfig
            self.config = dataclasses.replace(self.config, word_fraction=word_fraction)
        self.tiers = parse_tiers(tiers) if tiers is not None else None
        if self.tiers is not None and word_fraction is not None:  # each tier carries its own
            self.tiers = [dataclasses.replace(t, config=dataclasses.replace(t.config, word_fraction=word_fraction))
                          for t in self.tiers]
        self.n_tasks, self.task_seed = n_tasks, task_seed

    def load_tasks(self) -> Sequence[Task]:
        if self.tiers is not None:
            return make_tiered_tasks(self.n_tasks, self.tiers, self.task_seed)
        return make_tasks(self.n_tasks, self.config, self.task_seed)

    def expert(self, noise: float = 0.0, seed: int = 0, guess: float = 0.0,
               guess_tiers: Sequence[str] | None = None) -> Any:
        """The scripted expert; ``guess`` of its episodes answer at once without the tool (only on
        ``guess_tiers`` when given)."""
        from trace_gym.environments.math.experts import ArithmeticExpert

        return ArithmeticExpert(self.action_format, noise=noise, seed=seed, guess=guess, guess_tiers=guess_tiers)
