"""Multi-hop QA with a BM25 search tool: HotpotQA, 2WikiMultihopQA, MuSiQue and Bamboogle in one env class.

The model searches a passage index (``search(query)``) for a few turns and answers with
``<answer>...</answer>``. Reward 1 when the answer's token F1 against the gold answer or any alias is at least
0.3 (the TRACE paper's accuracy); EM and F1 are in ``info``.

Data comes from ``data_path`` if given, else the bundled sample, else the HF hub when ``from_hub=True``.
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
from trace_gym.errors import ConfigError
from trace_gym.tasks import Task
from trace_gym.tools import Tool

from .qa_data import BUNDLED, DATASETS, QAData, bundled_corpus, load_qa
from .qa_expert import QAExpert, format_action
from .qa_metrics import score_answer
from .retrieval import BM25Settings, Passage, SearchEngine, dedupe, get_index, load_corpus

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
          hub_id: str | None) -> QAData:
    """Loaded once per process for each source (``stamp`` = mtime, size, so an edited file reloads)."""
    return load_qa(dataset, split, data_path, from_hub, hub_id)


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
        data_path: str | os.PathLike[str] | None = None,
        corpus_path: str | os.PathLike[str] | None = None,
        corpus: Literal["dataset", "all"] = "dataset",
        from_hub: bool = False,
        hub_id: str | None = None,
        action_format: Literal["hermes", "tags"] = "hermes",
        top_k: int = 3,
        max_passage_chars: int = 600,
        bm25: BM25Settings | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        success_f1: float = 0.3,
        tasks: Sequence[Task] | None = None,
        max_turns: int = 8,
        render_mode: str | None = None,
    ):
        if dataset not in DATASETS:
            raise ConfigError(f"expected dataset in {DATASETS}, got {dataset!r}")
        if action_format not in ("hermes", "tags"):
            raise ConfigError(f"expected action_format 'hermes' or 'tags', got {action_format!r}")
        if corpus not in ("dataset", "all"):
            raise ConfigError(f"expected corpus 'dataset' or 'all', got {corpus!r}")
        if split is not None and data_path is None and not from_hub and split not in BUNDLED[dataset]:
            raise ConfigError(f"expected a bundled split of {dataset} in {sorted(BUNDLED[dataset])}, got {split!r}")
        if top_k < 1:
            raise ConfigError(f"expected top_k >= 1, got {top_k}")
        parser: ActionParser = HermesParser() if action_format == "hermes" else TagParser()
        super().__init__(tasks=tasks, max_turns=max_turns, parser=parser, render_mode=render_mode)
        self.dataset = dataset
        self.split = split
        self.data_path = None if data_path is None else str(Path(data_path).expanduser().resolve())
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

    # ----------------------------------------------------------------- data and index
    def _qa_data(self) -> QAData | None:
        if self.data_path is None and not self.from_hub and not BUNDLED[self.dataset]:
            return None
        return _data(self.dataset, self.split, self.data_path, _stamp(self.data_path), self.from_hub, self.hub_id)

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
            self._engine = SearchEngine(index, self.top_k, self.max_passage_chars)
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

    def begin(self, task: Task) -> str:
        _ = self.engine  # build or load the shared index now, not inside the first step
        return super().begin(task)

    def verify(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        scores = score_answer(answer, task.answer or [], self.success_f1)
        return scores["success"], {"em": scores["em"], "f1": scores["f1"]}

    def example_actions(self) -> list[str]:
        if self.task is None:
            return []
        fmt = self.action_format
        titles = list(self.task.meta.get("supporting_titles", []))
        gold = self.task.answer[0] if self.task.answer else ""
        return [
            format_action(fmt, "search", self.task.prompt),
            *(format_action(fmt, "search", t) for t in titles[:2]),
            format_action(fmt, "answer", gold),
            format_action(fmt, "answer", "not the answer"),
        ]

    def expert(self, noise: float = 0.0, seed: int = 0) -> QAExpert:
        """The scripted expert for this env's action format (see `QAExpert`)."""
        return QAExpert(noise=noise, seed=seed, action_format=self.action_format)
