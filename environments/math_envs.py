"""Math environments: the model solves a problem with a persistent, sandboxed Python tool and answers.

``MathEnv(dataset=...)`` serves GSM8K, MATH-500, AIME 2024, AMC 2023 and a DeepScaleR-style training mix
(AIME 1983-2023 + MATH train, the parts of DeepScaleR obtainable offline) from bundled data, a user file in the
same format (``data_path=``) or the hub (``from_hub=True``, needs the ``datasets`` package and a network).
``ArithmeticEnv`` is the procedural family for the CPU quickstart.

Actions: ``action_format="tags"`` (``<python>code</python>``, ``<answer>..</answer>``) or ``"hermes"``
(``<tool_call>{"name": "python", "arguments": {"code": ...}}</tool_call>``). A native snapshot is the env state
plus a frozen fork of the sandbox; a replay snapshot re-executes the cells.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from trace_gym.actions import ActionParser, HermesParser, TagParser
from trace_gym.env import TextEnv, ToolEnv
from trace_gym.environments.arithmetic import ArithmeticConfig, make_tasks
from trace_gym.environments.math_answers import check_answer, format_gold, gsm8k_gold
from trace_gym.environments.sandbox import PythonSandbox, SandboxLimits, SandboxSnapshot
from trace_gym.errors import ConfigError, DataError
from trace_gym.snapshot import NativeSnapshot
from trace_gym.tasks import Task
from trace_gym.tools import Tool

DATA_DIR = Path(__file__).parent / "data" / "math"
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
                 "expression) inside <answer></answer>.")


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError(f"expected a data file, got {str(path)!r} (not found); fix: pass data_path= a .json or "
                        ".jsonl file of problem records")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"expected JSON in {str(path)!r}, got invalid JSON at line {exc.lineno}, column {exc.colno}: "
                        f"{exc.msg}; fix: a .json array of records, or .jsonl with one record per line") from None
    if not isinstance(data, list):
        raise DataError(f"expected a JSON array of problems in {path}, got {type(data).__name__}")
    return data


def record_to_task(rec: Mapping[str, Any], task_id: str) -> Task:
    """A problem record in any of the supported formats (GSM8K, MATH, AIME, AMC, DeepScaleR) -> Task."""
    prompt = rec.get("problem") or rec.get("question") or rec.get("Problem")
    answer = rec.get("answer", rec.get("Answer"))
    if not isinstance(prompt, str) or answer is None:
        raise DataError(f"expected a record with 'problem' or 'question' and 'answer', got keys {sorted(rec)}")
    gold = gsm8k_gold(answer) if isinstance(answer, str) and "####" in answer else format_gold(answer)
    meta = {k: rec[k] for k in ("difficulty", "type", "year", "url", "level", "subject") if k in rec}
    return Task(id=str(rec.get("unique_id") or rec.get("id") or task_id), prompt=prompt, answer=gold, meta=meta)


def load_math_tasks(dataset: str = "math500", data_path: str | Path | None = None,
                    from_hub: bool = False) -> list[Task]:
    """Tasks of ``dataset`` from ``data_path`` (a .json array or .jsonl), the bundled copy, or the hub."""
    if dataset not in DATASETS:
        raise ConfigError(f"expected dataset in {sorted(DATASETS)}, got {dataset!r}")
    files, hub_id, hub_config, hub_split = DATASETS[dataset]
    if data_path is not None:
        sources = [(Path(data_path).stem, _records(Path(data_path)))]
    elif from_hub:
        try:
            import datasets  # optional; only when the user asks for the hub
        except ImportError:
            raise ConfigError("from_hub=True needs the datasets package: pip install datasets") from None
        sources = [(hub_id.split("/")[-1], list(datasets.load_dataset(hub_id, hub_config, split=hub_split)))]
    else:
        sources = [(Path(f).stem, _records(DATA_DIR / f)) for f in files]
    tasks, seen = [], set()
    for stem, recs in sources:
        for i, rec in enumerate(recs):
            if isinstance(rec, Mapping) and rec.get("answer", 0) in (None, ""):
                continue  # a few MATH-train records have no extracted answer
            task = record_to_task(rec, f"{dataset}-{stem}-{i}")
            if task.id in seen:  # ids must be unique within the dataset
                task = Task(f"{dataset}-{stem}-{i}", task.prompt, task.answer, task.meta)
            seen.add(task.id)
            tasks.append(task)
    return tasks


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
    """Env state plus a frozen fork of the sandbox worker."""

    def __init__(self, env: MathEnv):
        super().__init__(env)
        self.sandbox: SandboxSnapshot = env.sandbox.snapshot(native=True)

    def restore_into(self, env: TextEnv) -> tuple[str, dict[str, Any]]:
        out = super().restore_into(env)
        assert isinstance(env, MathEnv)
        env.sandbox.restore(self.sandbox)
        return out

    def release(self) -> None:
        self.sandbox.release()


class MathEnv(ToolEnv):
    """A math problem, a Python tool, an answer checked by math-verify/sympy. Binary reward."""

    system_prompt = SYSTEM_PROMPT

    def __init__(self, dataset: str = "math500", data_path: str | Path | None = None, from_hub: bool = False,
                 tasks: Sequence[Task] | None = None, action_format: Literal["tags", "hermes"] = "tags",
                 max_turns: int = 8, limits: SandboxLimits | None = None, sandbox_user: str | None = "nobody",
                 **kwargs: Any):
        super().__init__(tasks=tasks, max_turns=max_turns, parser=make_parser(action_format), **kwargs)
        if dataset not in DATASETS:
            raise ConfigError(f"expected dataset in {sorted(DATASETS)}, got {dataset!r}")
        self.dataset, self.data_path, self.from_hub = dataset, data_path, from_hub
        self.action_format = action_format
        self.sandbox = PythonSandbox(limits, user=sandbox_user)

    def load_tasks(self) -> Sequence[Task]:
        return load_math_tasks(self.dataset, self.data_path, self.from_hub)

    def tools(self) -> Sequence[Tool]:
        return [python_tool(self.sandbox)]

    def begin(self, task: Task) -> str:
        self.sandbox.reset()
        return super().begin(task)

    def verify(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return check_answer(answer, task.answer)

    def native_snapshot(self) -> MathSnapshot:
        return MathSnapshot(self)

    def example_actions(self) -> list[str]:
        cells = ["x = 6 * 7\nprint(x)", "x = x + 1\nx", "import sympy as sp\nprint(sp.factorint(360))",
                 "print(undefined_name)"]
        answer = str(self.task.answer) if self.task is not None else "0"
        return [self.format_call(c) for c in cells] + [f"<answer>{answer}</answer>", "<answer>-1</answer>"]

    def format_call(self, code: str) -> str:
        """A turn that runs ``code`` in this env's action format."""
        if self.action_format == "hermes":
            return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"
        return f"<python>{code}</python>"

    def expert(self, noise: float = 0.0, seed: int = 0) -> Any:
        from trace_gym.environments.math_experts import MathExpert

        return MathExpert(self.action_format, noise=noise, seed=seed)

    def close(self) -> None:
        self.sandbox.close()
        super().close()


class ArithmeticEnv(MathEnv):
    """Procedural arithmetic and word problems (``trace/Arithmetic-v0``), solvable with one tool call."""

    system_prompt = ("Compute the answer. Run Python with <python>print(expression)</python> (or the python "
                     "tool), read the output, then reply <answer>the number</answer>.")
    compact_prompt = "Run <python>print(expression)</python>, then reply <answer>the number</answer>."

    def __init__(self, difficulty: int | None = None, config: ArithmeticConfig | Mapping[str, Any] | None = None,
                 n_tasks: int = 2000,
                 task_seed: int = 0, max_turns: int = 4, word_fraction: float | None = None, **kwargs: Any):
        super().__init__(dataset="math500", max_turns=max_turns, **kwargs)
        if difficulty is not None and config is not None:
            raise ConfigError("expected difficulty or config, got both; pass one")
        if isinstance(config, Mapping):  # from YAML or gym.make: {min_ops: 1, max_ops: 6, ...}
            known = {f.name for f in dataclasses.fields(ArithmeticConfig)}
            if set(config) - known:
                raise ConfigError(f"expected config keys among {sorted(known)}, got {sorted(set(config) - known)}")
            config = ArithmeticConfig(**config)
        self.config = ArithmeticConfig.level(difficulty) if difficulty is not None else (config or ArithmeticConfig())
        if word_fraction is not None:  # settable from YAML/gym.make without building an ArithmeticConfig
            self.config = dataclasses.replace(self.config, word_fraction=word_fraction)
        self.n_tasks, self.task_seed = n_tasks, task_seed

    def load_tasks(self) -> Sequence[Task]:
        return make_tasks(self.n_tasks, self.config, self.task_seed)

    def expert(self, noise: float = 0.0, seed: int = 0) -> Any:
        from trace_gym.environments.math_experts import ArithmeticExpert

        return ArithmeticExpert(self.action_format, noise=noise, seed=seed)
