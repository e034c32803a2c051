"""Multi-hop QA with a BM25 search tool: HotpotQA, 2WikiMultihopQA, MuSiQue and Bamboogle in one env class.

The model searches a passage index (``search(query)``) for a few turns and answers with
``<answer>...</answer>``. The reward is chosen by name (``reward=``): "em" (default) is 1 when the normalised
answer equals the gold answer or an alias; "f1" is the TRACE paper's accuracy, token F1 >= ``success_f1``
(0.3), which a policy games by hedging ("A or B") or padding (docs/rewards.md). ``info`` always holds
``em``, ``f1`` and ``accuracy`` (the paper's metric) for evaluation.

Data comes from ``data_path`` (a file, a ``datasets.Dataset`` or a list of records; ``fields=`` maps column
names) if given, else the bundled sample, else the HF hub when ``from_hub=True``.
The index covers the pooled paragraphs of the dataset's bundled sample (or of the user file), the pool of
all bundled sets (``corpus="all"``, and Bamboogle's default), or a user corpus (``corpus_path``). It is built
at the first reset, cached on disk and shared by every env instance of the process; it is not episode
state, so snapshots never copy it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from trace_gym.actions import ActionParser, HermesParser, TagParser
from trace_gym.env import ToolEnv
from trace_gym.environments.qa.data import BUNDLED, DATASETS, UNANSWERABLE, QAData, bundled_corpus, load_qa
from trace_gym.environments.qa.expert import QAExpert
from trace_gym.environments.qa.metrics import QA_REWARDS, qa_reward, score_answer
from trace_gym.environments.qa.retrieval import BM25Settings, Passage, SearchEngine, dedupe, get_index, load_corpus
from trace_gym.environments.records import Fields, Source
from trace_gym.errors import ConfigError
from trace_gym.tasks import Task
from trace_gym.tools import Tool, ToolCall

__all__ = ["MultiHopQAEnv"]

_SYSTEM_PROMPT = (
    "Answer the user's question. It may need several facts: search for one entity at a time, read the "
    "passages, then search again with what you learned. Answer with a short phrase (a name, date or number), "
    "not a sentence."
)

_SEARCH_SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "keywords or a question to look up"}},
    "required": ["query"],
    "additionalProperties": False,
}


@lru_cache(maxsize=16)
def _data(dataset: str, split: str | None, data_path: str | None, stamp: tuple[int, int], from_hub: bool,
          hub_id: str | None, fields: tuple[tuple[str, str], ...], include_unanswerable: bool) -> QAData:
    """Loaded once per process for each source (``stamp`` = mtime, size, so an edited file reloads)."""
    return load_qa(dataset, split, data_path, from_hub, hub_id, dict(fields) or None, include_unanswerable)


@lru_cache(maxsize=8)
def _user_corpus(path: str, stamp: tuple[int, int]) -> tuple[Passage, ...]:
    return tuple(dedupe(load_corpus(path)))


def _stamp(path: str | None) -> tuple[int, int]:
    if path is None or not os.path.exists(path):
        return (0, 0)
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size)


class MultiHopQAEnv(ToolEnv):
    """Search-and-answer episodes over one multi-hop QA dataset."""

    system_prompt = _SYSTEM_PROMPT
    compact_prompt = "Search one entity at a time with <search>name</search>, then reply <answer>short phrase</answer>."

    def __init__(
        self,
        dataset: Literal["hotpotqa", "2wiki", "musique", "bamboogle"] = "hotpotqa",
        split: str | None = None,
        data_path: Source | None = None,
        corpus_path: str | os.PathLike[str] | None = None,
        corpus: Literal["dataset", "all"] = "dataset",
        from_hub: bool = False,
        hub_id: str | None = None,
        fields: Fields | None = None,
        include_unanswerable: bool = False,
        reward: Literal["em", "f1"] = "em",
        action_format: Literal["hermes", "tags"] = "hermes",
        top_k: int = 3,
        max_passage_chars: int = 1000,
        passage_window: Literal["head", "query"] = "head",
        bm25: BM25Settings | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        success_f1: float = 0.3,
        tasks: Sequence[Task] | None = None,
        max_turns: int = 8,
        max_tool_calls: int = 4,
        render_mode: str | None = None,
    ):
        if dataset not in DATASETS:
            raise ConfigError(f"expected dataset in {DATASETS}, got {dataset!r}")
        if reward not in QA_REWARDS:
            raise ConfigError(f"expected reward in {sorted(QA_REWARDS)}, got {reward!r}; fix: 'em' (exact match "
                              "against the gold answer or an alias) or 'f1' (the paper's F1 >= success_f1)")
        if action_format not in ("hermes", "tags"):
            raise ConfigError(f"expected action_format 'hermes' or 'tags', got {action_format!r}")
        if corpus not in ("dataset", "all"):
            raise ConfigError(f"expected corpus 'dataset' or 'all', got {corpus!r}")
        if split is not None and data_path is None and not from_hub and split not in BUNDLED[dataset]:
            raise ConfigError(f"expected a bundled split of {dataset} in {sorted(BUNDLED[dataset])}, got {split!r}")
        if top_k < 1:
            raise ConfigError(f"expected top_k >= 1, got {top_k}")
        parser: ActionParser = HermesParser() if action_format == "hermes" else TagParser()
        super().__init__(tasks=tasks, max_turns=max_turns, parser=parser, max_tool_calls=max_tool_calls,
                         render_mode=render_mode)
        self.dataset = dataset
        self.split = split
        if isinstance(data_path, str | os.PathLike):
            data_path = str(Path(data_path).expanduser().resolve())
        self.data_path = data_path
        self.fields = dict(fields or {})
        self.include_unanswerable = include_unanswerable
        self.reward = reward
        self.passage_window = passage_window
        self.corpus_path = None if corpus_path is None else str(Path(corpus_path).expanduser().resolve())
        self.corpus = corpus
        self.from_hub = from_hub
        self.hub_id = hub_id
        self.action_format = action_format
        self.top_k = top_k
        self.max_passage_chars = max_passage_chars
        self.bm25 = bm25 or BM25Settings()
        self.cache_dir = cache_dir
        self.success_f1 = success_f1
        self._engine: SearchEngine | None = None  # shared index inside; never episode state
        self._records: QAData | None = None  # data loaded from in-memory records

    # ----------------------------------------------------------------- data and index
    def _qa_data(self) -> QAData | None:
        if self.data_path is None and not self.from_hub and not BUNDLED[self.dataset]:
            return None
        if self.data_path is not None and not isinstance(self.data_path, str):  # in-memory records: no cache key
            if self._records is None:
                self._records = load_qa(self.dataset, self.split, self.data_path, fields=self.fields or None,
                                        include_unanswerable=self.include_unanswerable)
            return self._records
        return _data(self.dataset, self.split, self.data_path, _stamp(self.data_path), self.from_hub, self.hub_id,
                     tuple(sorted(self.fields.items())), self.include_unanswerable)

    def load_tasks(self) -> Sequence[Task]:
        data = self._qa_data()
        if data is None:
            # Raised at the first reset, not at construction, so listing the registered ids still works.
            raise ConfigError(
                f"expected data_path= (or from_hub=True) for {self.dataset!r}, got neither; fix: {self.dataset} "
                "ships no offline copy: pass data_path= to a JSON/JSONL file of {Question, Answer} records"
            )
        return data.tasks

    def corpus_passages(self) -> tuple[Passage, ...]:
        """The passages the search tool indexes (see the module docstring for the choice)."""
        if self.corpus_path is not None:
            return _user_corpus(self.corpus_path, _stamp(self.corpus_path))
        data = self._qa_data() if self.data_path is not None or self.from_hub else None
        own = data.passages if data is not None else ()
        if self.corpus == "all":
            return tuple(dedupe([*own, *bundled_corpus("all")]))
        # Question-only sets (Bamboogle, the dev500 lists) search the pool of every bundled set.
        return own or bundled_corpus(self.dataset) or bundled_corpus("all")

    @property
    def engine(self) -> SearchEngine:
        if self._engine is None:
            index = get_index(self.corpus_passages(), self.bm25, self.cache_dir)
            self._engine = SearchEngine(index, self.top_k, self.max_passage_chars, window=self.passage_window)
        return self._engine

    def search(self, query: str) -> str:
        return self.engine(query)

    # ----------------------------------------------------------------- ToolEnv hooks
    def tools(self) -> Sequence[Tool]:
        description = (
            f"Search a Wikipedia passage index (BM25). Returns the top {self.top_k} passages as numbered "
            "'Doc i (Title: ...) text' lines."
        )
        return [Tool("search", description, _SEARCH_SCHEMA, self.search)]

    def system_message(self) -> str:
        message = super().system_message()
        if self.include_unanswerable:
            message += f" If the passages cannot answer the question, answer {UNANSWERABLE}."
        return message

    def begin(self, task: Task) -> str:
        _ = self.engine  # build or load the shared index now, not inside the first step
        return super().begin(task)

    def verify(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        scores = score_answer(answer, task.answer or [], self.success_f1)
        return qa_reward(self.reward, scores), scores

    def example_actions(self) -> list[str]:
        if self.task is None:
            return []
        titles = list(self.task.meta.get("supporting_titles", []))
        gold = self.task.answer[0] if self.task.answer else ""
        return [
            *(self.parser.format(self.search_call(q)) for q in [self.task.prompt, *titles[:2]]),
            self.parser.format_answer(gold),
            self.parser.format_answer("not the answer"),
        ]

    @staticmethod
    def search_call(query: str) -> ToolCall:
        return ToolCall("search", {"query": query})

    def expert(self, noise: float = 0.0, seed: int = 0) -> QAExpert:
        """The scripted expert for this env's action format (see `QAExpert`)."""
        return QAExpert(noise=noise, seed=seed, action_format=self.action_format, reward=self.reward,
                        success_f1=self.success_f1)
