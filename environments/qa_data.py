"""Loaders for the multi-hop QA sets, one per official format, plus the bundled samples and the pooled corpora.

Every loader returns a `QAData`: tasks (``Task.answer`` = [gold, *aliases]; ``meta`` holds the dataset, the
supporting-fact titles and the context titles) and the paragraphs of all its questions, pooled and deduplicated
so that retrieval faces the other questions' paragraphs as real distractors.

Formats (field layouts as in each dataset's release):
- HotpotQA distractor: ``_id, question, answer, type, level, supporting_facts [[title, sent_idx]],
  context [[title, [sentences]]]``; the HF hub's columnar form (``context {title: [...], sentences: [...]}``)
  is accepted too. JSON array or JSONL.
- 2WikiMultihopQA: the HotpotQA layout plus ``evidences [[subject, relation, object]]``.
- MuSiQue: ``id, question, answer, answer_aliases, answerable, paragraphs [{idx, title, paragraph_text,
  is_supporting}]``.
- Question lists (R1-Searcher eval sets ``idx, question, answer``; ReAct's ``{question, answer}``) and
  Bamboogle (``Question, Answer``, as in Press et al. 2022 and its HF copy): no paragraphs; they are searched
  over the dataset's bundled pool, the pool of all bundled sets, or a user corpus.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from trace_gym.errors import ConfigError, DataError
from trace_gym.tasks import Task

from .retrieval import Passage, dedupe, join_sentences

__all__ = [
    "BUNDLED",
    "DATASETS",
    "HUB_IDS",
    "QAData",
    "bundled_corpus",
    "load_2wiki",
    "load_bamboogle",
    "load_bundled",
    "load_from_hub",
    "load_hotpotqa",
    "load_musique",
    "load_qa",
    "load_questions",
    "read_records",
]

Dataset = Literal["hotpotqa", "2wiki", "musique", "bamboogle"]
DATASETS: tuple[str, ...] = ("hotpotqa", "2wiki", "musique", "bamboogle")

# dataset -> split -> (directory under data/qa, file, loader format)
BUNDLED: dict[str, dict[str, tuple[str, str, str]]] = {
    "hotpotqa": {
        "train": ("hotpotqa", "train_distractor_100.json", "hotpotqa"),
        "dev": ("hotpotqa", "dev_distractor_200.jsonl", "hotpotqa"),
        "dev500": ("hotpotqa", "dev_500_r1searcher.jsonl", "questions"),
    },
    "2wiki": {
        "train": ("2wikimultihopqa", "train_500.jsonl", "2wiki"),
        "dev500": ("2wikimultihopqa", "dev_500_r1searcher.jsonl", "questions"),
    },
    "musique": {
        "train": ("musique", "train_100.json", "musique"),
        "dev500": ("musique", "dev_500_r1searcher.jsonl", "questions"),
    },
    "bamboogle": {"test": ("bamboogle", "bamboogle_125.jsonl", "questions")},
}
# Extra corpus files pooled into a dataset's bundled corpus (beyond its splits' own paragraphs).
_BUNDLED_CORPORA: dict[str, tuple[tuple[str, str], ...]] = {
    "hotpotqa": (("hotpotqa", "train_distractor_100_corpus.json"),),
    "musique": (("musique", "train_100_corpus.json"),),
}
# from_hub=True only; the ids of public copies in the official layouts (override with hub_id=).
HUB_IDS: dict[str, tuple[str, str | None, str]] = {
    "hotpotqa": ("hotpotqa/hotpot_qa", "distractor", "hotpotqa"),
    "2wiki": ("framolfese/2WikiMultihopQA", None, "2wiki"),
    "musique": ("dgslibisey/MuSiQue", None, "musique"),
    "bamboogle": ("chiayewken/bamboogle", None, "bamboogle"),
}


@dataclass(frozen=True)
class QAData:
    """Tasks and the pooled, deduplicated paragraphs of all of them (empty for question-only sets)."""

    tasks: tuple[Task, ...]
    passages: tuple[Passage, ...]


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A JSON array or JSON Lines file of objects."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"expected a data file, got missing path {path}; fix: check data_path")
    raw = path.read_text(encoding="utf-8")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        try:
            data = [json.loads(line) for line in raw.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise DataError(f"expected a JSON array or JSON Lines in {path}, got a parse error: {e}") from e
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DataError(f"expected a list of JSON objects in {path}, got {type(data).__name__}")
    return data


def _require(record: Mapping[str, Any], keys: Iterable[str], where: str) -> None:
    missing = [k for k in keys if k not in record]
    if missing:
        raise DataError(f"expected fields {missing} in {where}, got {sorted(record)}; fix: use the official layout")


def _pairs(field: Any, first: str, second: str) -> list[tuple[Any, Any]]:
    """[[a, b], ...] or the HF columnar {first: [a...], second: [b...]} as a list of pairs."""
    if isinstance(field, Mapping):
        return list(zip(field.get(first, []), field.get(second, [])))
    return [(item[0], item[1]) for item in field]


def _unique_titles(titles: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(titles))


def _answers(answer: Any, aliases: Iterable[Any] = ()) -> list[str]:
    golds = answer if isinstance(answer, list) else [answer]
    return list(dict.fromkeys(str(a) for a in [*golds, *aliases] if a is not None and str(a).strip()))


def _unique_id(raw: Any, index: int, seen: set[str]) -> str:
    tid = str(raw) if raw is not None and str(raw) else str(index)
    base, n = tid, 1
    while tid in seen:
        n += 1
        tid = f"{base}#{n}"
    seen.add(tid)
    return tid


def _from_context_records(records: Sequence[Mapping[str, Any]], dataset: str, where: str) -> QAData:
    """HotpotQA and 2Wiki share the layout; 2Wiki adds evidences (kept in meta)."""
    tasks, passages, seen = [], [], set()
    for i, r in enumerate(records):
        _require(r, ("question", "answer", "context"), f"{where} record {i}")
        context = _pairs(r["context"], "title", "sentences")
        paragraphs = [Passage(str(t), join_sentences([str(s) for s in sents])) for t, sents in context]
        passages.extend(paragraphs)
        support = _unique_titles(str(t) for t, _ in _pairs(r.get("supporting_facts", []), "title", "sent_id"))
        meta: dict[str, Any] = {
            "dataset": dataset,
            "supporting_titles": support,
            "titles": _unique_titles(p.title for p in paragraphs),
        }
        for key in ("type", "level"):
            if key in r:
                meta[key] = r[key]
        if "evidences" in r:
            meta["evidences"] = r["evidences"]
        tid = _unique_id(r.get("_id", r.get("id")), i, seen)
        tasks.append(Task(id=tid, prompt=str(r["question"]), answer=_answers(r["answer"]), meta=meta))
    return QAData(tuple(tasks), tuple(dedupe(passages)))


def load_hotpotqa(path: str | os.PathLike[str]) -> QAData:
    return _from_context_records(read_records(path), "hotpotqa", str(path))


def load_2wiki(path: str | os.PathLike[str]) -> QAData:
    return _from_context_records(read_records(path), "2wiki", str(path))


def _musique(records: Sequence[Mapping[str, Any]], where: str) -> QAData:
    tasks, passages, seen = [], [], set()
    for i, r in enumerate(records):
        _require(r, ("question", "answer", "paragraphs"), f"{where} record {i}")
        if r.get("answerable") is False:
            continue  # MuSiQue-Full's unanswerable contrast questions have no gold answer to reward
        paragraphs = r["paragraphs"]
        pooled = [Passage(str(p["title"]), str(p["paragraph_text"])) for p in paragraphs]
        passages.extend(pooled)
        meta: dict[str, Any] = {
            "dataset": "musique",
            "supporting_titles": _unique_titles(str(p["title"]) for p in paragraphs if p.get("is_supporting")),
            "titles": _unique_titles(p.title for p in pooled),
        }
        tid = _unique_id(r.get("id"), i, seen)
        answer = _answers(r["answer"], r.get("answer_aliases") or ())
        tasks.append(Task(id=tid, prompt=str(r["question"]), answer=answer, meta=meta))
    return QAData(tuple(tasks), tuple(dedupe(passages)))


def load_musique(path: str | os.PathLike[str]) -> QAData:
    return _musique(read_records(path), str(path))


def _field(record: Mapping[str, Any], name: str) -> Any:
    """Case-insensitive field lookup (Bamboogle's release uses "Question"/"Answer")."""
    if name in record:
        return record[name]
    for k, v in record.items():
        if k.lower() == name:
            return v
    return None


def _questions(records: Sequence[Mapping[str, Any]], dataset: str, where: str) -> QAData:
    tasks, seen = [], set()
    for i, r in enumerate(records):
        question, answer = _field(r, "question"), _field(r, "answer")
        if question is None or answer is None:
            raise DataError(f"expected fields question and answer in {where} record {i}, got {sorted(r)}")
        aliases = _field(r, "answer_aliases") or _field(r, "aliases") or ()
        tid = _unique_id(r.get("idx", r.get("id", r.get("_id"))), i, seen)
        meta = {"dataset": dataset, "supporting_titles": [], "titles": []}
        tasks.append(Task(id=tid, prompt=str(question), answer=_answers(answer, aliases), meta=meta))
    return QAData(tuple(tasks), ())


def load_questions(path: str | os.PathLike[str], dataset: str = "questions") -> QAData:
    """Question/answer lists without paragraphs (R1-Searcher's ``idx, question, answer`` JSONL, and alike)."""
    return _questions(read_records(path), dataset, str(path))


def load_bamboogle(path: str | os.PathLike[str]) -> QAData:
    return _questions(read_records(path), "bamboogle", str(path))


def _parse(records: Sequence[Mapping[str, Any]], fmt: str, dataset: str, where: str) -> QAData:
    if fmt == "hotpotqa" or fmt == "2wiki":
        return _from_context_records(records, dataset, where)
    if fmt == "musique":
        return _musique(records, where)
    return _questions(records, dataset, where)


def _detect_format(records: Sequence[Mapping[str, Any]], dataset: str) -> str:
    """The official layout of `dataset` when records carry paragraphs, else a question list."""
    if not records:
        return "questions"
    first = records[0]
    if "paragraphs" in first:
        return "musique"
    if "context" in first:
        return "2wiki" if dataset == "2wiki" else "hotpotqa"
    return "questions"


def load_file(path: str | os.PathLike[str], dataset: str) -> QAData:
    """A user file in the official layout of `dataset`, or a question list (detected from its fields)."""
    records = read_records(path)
    return _parse(records, _detect_format(records, dataset), dataset, str(path))


def _data_dir() -> Path:
    return Path(str(resources.files("trace_gym.environments") / "data" / "qa"))


def _check_dataset(dataset: str) -> None:
    if dataset not in DATASETS:
        raise ConfigError(f"expected dataset in {DATASETS}, got {dataset!r}")


@lru_cache(maxsize=32)
def load_bundled(dataset: str, split: str = "train") -> QAData:
    """A bundled real sample (see data/qa/<set>/SOURCE.md). Cached: the files never change."""
    _check_dataset(dataset)
    splits = BUNDLED[dataset]
    if split not in splits:
        fix = "pass data_path= or from_hub=True" if not splits else f"use one of {sorted(splits)}"
        raise ConfigError(f"expected a bundled split of {dataset} in {sorted(splits)}, got {split!r}; fix: {fix}")
    directory, name, fmt = splits[split]
    path = _data_dir() / directory / name
    data = _parse(read_records(path), fmt, dataset, str(path))
    tasks = tuple(replace(t, meta={**t.meta, "split": split}) for t in data.tasks)
    return QAData(tasks, data.passages)


@lru_cache(maxsize=8)
def bundled_corpus(dataset: str | Literal["all"]) -> tuple[Passage, ...]:
    """The pooled paragraphs of every bundled split (and extra corpus file) of `dataset`, or of all sets."""
    from .retrieval import load_corpus

    names = [d for d in DATASETS if BUNDLED[d]] if dataset == "all" else [dataset]
    passages: list[Passage] = []
    for name in names:
        _check_dataset(name)
        for split in BUNDLED[name]:
            passages.extend(load_bundled(name, split).passages)
        for directory, file in _BUNDLED_CORPORA.get(name, ()):
            passages.extend(load_corpus(_data_dir() / directory / file))
    return tuple(dedupe(passages))


def load_from_hub(dataset: str, split: str, hub_id: str | None = None, config: str | None = None) -> QAData:
    """Download through HF `datasets` (optional dependency, network); only on an explicit from_hub=True."""
    _check_dataset(dataset)
    try:
        import datasets
    except ImportError as e:
        raise ConfigError(
            "expected the `datasets` package for from_hub=True, got ImportError; fix: pip install datasets, "
            "or pass data_path= to a local file"
        ) from e
    default_id, default_config, fmt = HUB_IDS[dataset]
    ds = datasets.load_dataset(hub_id or default_id, config if hub_id else (config or default_config), split=split)
    records = [dict(r) for r in ds]
    if hub_id:
        fmt = _detect_format(records, dataset)
    return _parse(records, fmt, dataset, f"{hub_id or default_id}:{split}")


def load_qa(
    dataset: str,
    split: str | None = None,
    data_path: str | os.PathLike[str] | None = None,
    from_hub: bool = False,
    hub_id: str | None = None,
) -> QAData:
    """Data in the documented order: `data_path`, else the bundled sample, else the hub if `from_hub`."""
    _check_dataset(dataset)
    if data_path is not None:
        return load_file(data_path, dataset)
    if from_hub:
        default = "test" if dataset == "bamboogle" else "train"
        return load_from_hub(dataset, split or default, hub_id)
    if not BUNDLED[dataset]:
        raise ConfigError(
            f"expected data_path= or from_hub=True for {dataset}, got neither; fix: Bamboogle is not bundled "
            "(no offline copy): pass data_path= to a JSON/JSONL file of {Question, Answer} records"
        )
    return load_bundled(dataset, split or next(iter(BUNDLED[dataset])))
