"""Loaders for the multi-hop QA sets, one per official format, plus the bundled samples and the pooled corpora.

Every loader returns a `QAData`: tasks (``Task.answer`` = [gold, *aliases]; ``meta`` holds the dataset, the
supporting-fact titles and the context titles), the paragraphs of all its questions, pooled and deduplicated
so that retrieval faces the other questions' paragraphs as real distractors, and each task's supporting
paragraphs (for retrieval benchmarks; kept out of ``Task`` so snapshots never copy them).

Formats (field layouts as in each dataset's release), from a JSON array, JSON Lines, CSV/TSV, or in-memory
records (a ``datasets.Dataset``); ``fields=`` maps the names below to other column names:
- HotpotQA distractor: ``_id, question, answer, type, level, supporting_facts [[title, sent_idx]],
  context [[title, [sentences]]]``; the HF hub's columnar form (``context {title: [...], sentences: [...]}``)
  is accepted too.
- 2WikiMultihopQA: the HotpotQA layout plus ``evidences [[subject, relation, object]]``.
- MuSiQue: ``id, question, answer, answer_aliases, answerable, paragraphs [{idx, title, paragraph_text,
  is_supporting}]``. MuSiQue-Full's unanswerable records (``answerable: false``) are never dropped: their
  paragraphs join the pool as distractors and the questions are kept in ``QAData.unanswerable``;
  ``include_unanswerable=True`` makes them tasks whose gold answer is "unanswerable".
- Question lists (R1-Searcher eval sets ``idx, question, answer``; ReAct's ``{question, answer}``; FlashRAG's
  ``id, question, golden_answers``) and Bamboogle (``Question, Answer`` as released by Press et al. 2022, its
  HF copy, or the R1-Searcher list): no paragraphs; searched over the dataset's bundled pool, the pool of all
  bundled sets, or a user corpus. An answer given as a list, or a column of accepted answers (``Accepted
  answers``, ``aliases``, ``answer_aliases``, ``golden_answers``; a JSON list or one string), becomes aliases.
  Bamboogle's ids are derived from the question text (``bamboogle-<hash>``), so its releases, which number
  the same questions differently (from 0, from 1, or not at all), give the same id to the same question.
"""

from __future__ import annotations

import ast
import hashlib
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from trace_gym.environments.qa.retrieval import Passage, dedupe, join_sentences
from trace_gym.environments.records import Fields, Source, check_fields, find_column, read_records
from trace_gym.errors import ConfigError, DataError, SetupError
from trace_gym.tasks import Task

__all__ = [
    "BUNDLED",
    "DATASETS",
    "FIELDS",
    "HUB_IDS",
    "UNANSWERABLE",
    "QAData",
    "bamboogle_id",
    "bundled_corpus",
    "load_2wiki",
    "load_bamboogle",
    "load_bundled",
    "load_from_hub",
    "load_hotpotqa",
    "load_musique",
    "load_qa",
    "load_questions",
    "load_records",
]

log = logging.getLogger(__name__)

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


UNANSWERABLE = "unanswerable"
"""The gold answer of MuSiQue's unanswerable questions when they are included as tasks."""
# The field names fields= may map, per layout (the loaders' own names).
FIELDS: dict[str, tuple[str, ...]] = {
    "context": ("id", "question", "answer", "context", "supporting_facts", "type", "level", "evidences"),
    "musique": ("id", "question", "answer", "answer_aliases", "answerable", "paragraphs"),
    "questions": ("id", "question", "answer", "aliases"),
}
_ALIAS_COLUMNS = ("aliases", "answer_aliases", "accepted_answers", "accepted answer", "golden_answers", "answers")


@dataclass(frozen=True)
class QAData:
    """Tasks, the pooled deduplicated paragraphs of all of them (empty for question-only sets), the supporting
    paragraphs of each task id, and the unanswerable questions not made tasks (MuSiQue-Full)."""

    tasks: tuple[Task, ...]
    passages: tuple[Passage, ...]
    support: Mapping[str, tuple[Passage, ...]] = field(default_factory=dict)
    unanswerable: tuple[Task, ...] = ()


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


def _as_list(value: Any) -> list[Any]:
    """A list of answers: a list as is, a string holding a JSON/Python list literal parsed, else [value]."""
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, str) and value.strip().startswith("[") and value.strip().endswith("]"):
        try:
            parsed = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            return [value]
        return list(parsed) if isinstance(parsed, list | tuple) else [value]
    return [] if value is None else [value]


def _answers(answer: Any, aliases: Any = ()) -> list[str]:
    values = [*_as_list(answer), *_as_list(aliases)]
    return list(dict.fromkeys(str(a).strip() for a in values if a is not None and str(a).strip()))


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
    tasks, passages, seen, support = [], [], set[str](), {}
    for i, r in enumerate(records):
        _require(r, ("question", "answer", "context"), f"{where} record {i}")
        context = _pairs(r["context"], "title", "sentences")
        paragraphs = [Passage(str(t), join_sentences([str(s) for s in sents])) for t, sents in context]
        passages.extend(paragraphs)
        titles = _unique_titles(str(t) for t, _ in _pairs(r.get("supporting_facts", []), "title", "sent_id"))
        meta: dict[str, Any] = {
            "dataset": dataset,
            "supporting_titles": titles,
            "titles": _unique_titles(p.title for p in paragraphs),
        }
        for key in ("type", "level"):
            if key in r:
                meta[key] = r[key]
        if "evidences" in r:
            meta["evidences"] = r["evidences"]
        tid = _unique_id(r.get("_id", r.get("id")), i, seen)
        tasks.append(Task(id=tid, prompt=str(r["question"]), answer=_answers(r["answer"]), meta=meta))
        support[tid] = tuple(p for p in paragraphs if p.title in set(titles))
    return QAData(tuple(tasks), tuple(dedupe(passages)), support)


def load_hotpotqa(path: Source, fields: Fields | None = None) -> QAData:
    return _from_context_records(load_records(path, "context", fields), "hotpotqa", _where(path))


def load_2wiki(path: Source, fields: Fields | None = None) -> QAData:
    return _from_context_records(load_records(path, "context", fields), "2wiki", _where(path))


def _musique(records: Sequence[Mapping[str, Any]], where: str, include_unanswerable: bool = False) -> QAData:
    tasks, passages, seen, support, unanswerable = [], [], set[str](), {}, []
    for i, r in enumerate(records):
        _require(r, ("question", "paragraphs"), f"{where} record {i}")
        answerable = r.get("answerable") is not False
        if answerable:
            _require(r, ("answer",), f"{where} record {i}")
        paragraphs = r["paragraphs"]
        pooled = [Passage(str(p["title"]), str(p["paragraph_text"])) for p in paragraphs]
        passages.extend(pooled)  # unanswerable records' paragraphs too: real distractors
        meta: dict[str, Any] = {
            "dataset": "musique",
            "supporting_titles": _unique_titles(str(p["title"]) for p in paragraphs if p.get("is_supporting")),
            "titles": _unique_titles(p.title for p in pooled),
            "answerable": answerable,
        }
        tid = _unique_id(r.get("id"), i, seen)
        if answerable:
            answer = _answers(r["answer"], r.get("answer_aliases") or ())
        else:
            # MuSiQue-Full pairs each unanswerable question with an answerable one; the released "answer" is
            # the pair's, which the unanswerable question's paragraphs do not support.
            meta["paired_answer"] = r.get("answer")
            answer = [UNANSWERABLE]
        task = Task(id=tid, prompt=str(r["question"]), answer=answer, meta=meta)
        if answerable or include_unanswerable:
            tasks.append(task)
            support[tid] = tuple(p for p, raw in zip(pooled, paragraphs) if raw.get("is_supporting"))
        else:
            unanswerable.append(task)
    if unanswerable:
        log.warning("%s: %d unanswerable MuSiQue questions are not tasks (their paragraphs are in the corpus as "
                    "distractors); pass include_unanswerable=True to train or evaluate on them", where,
                    len(unanswerable))
    return QAData(tuple(tasks), tuple(dedupe(passages)), support, tuple(unanswerable))


def load_musique(path: Source, fields: Fields | None = None, include_unanswerable: bool = False) -> QAData:
    return _musique(load_records(path, "musique", fields), _where(path), include_unanswerable)


def bamboogle_id(question: str) -> str:
    """A Bamboogle task id from its question text (case, spacing and punctuation ignored)."""
    key = " ".join(re.findall(r"\w+", question.lower()))
    return "bamboogle-" + hashlib.sha1(key.encode("utf-8")).hexdigest()[:12]


def _questions(records: Sequence[Mapping[str, Any]], dataset: str, where: str) -> QAData:
    tasks, seen = [], set[str]()
    for i, r in enumerate(records):
        qcol = find_column(r, ("question", "query"))
        acol = find_column(r, ("answer", "golden_answers", "answers"))
        if qcol is None or acol is None:
            raise DataError(f"expected fields question and answer in {where} record {i}, got {sorted(r)}; fix: "
                            "map your columns with fields={'question': ..., 'answer': ...}")
        alias_cols = [c for c in (find_column(r, (name,)) for name in _ALIAS_COLUMNS) if c not in (None, acol)]
        aliases = [a for c in alias_cols for a in _as_list(r[c])]
        question = str(r[qcol])
        raw_id = bamboogle_id(question) if dataset == "bamboogle" else r.get("idx", r.get("id", r.get("_id")))
        tid = _unique_id(raw_id, i, seen)
        meta = {"dataset": dataset, "supporting_titles": [], "titles": []}
        tasks.append(Task(id=tid, prompt=question, answer=_answers(r[acol], aliases), meta=meta))
    return QAData(tuple(tasks), ())


def load_questions(path: Source, dataset: str = "questions", fields: Fields | None = None) -> QAData:
    """Question/answer lists without paragraphs (R1-Searcher's ``idx, question, answer`` JSONL, and alike)."""
    return _questions(load_records(path, "questions", fields), dataset, _where(path))


def load_bamboogle(path: Source, fields: Fields | None = None) -> QAData:
    return _questions(load_records(path, "questions", fields), "bamboogle", _where(path))


def _where(source: Source) -> str:
    return str(source) if isinstance(source, str | os.PathLike) else type(source).__name__


def load_records(source: Source, layout: str, fields: Fields | None = None) -> list[dict[str, Any]]:
    """Records of a file or in-memory dataset, with ``fields`` checked against the layout's names."""
    check_fields(fields, FIELDS[layout], f"the {layout} layout")
    return read_records(source, fields)


def _parse(records: Sequence[Mapping[str, Any]], fmt: str, dataset: str, where: str,
           include_unanswerable: bool = False) -> QAData:
    if fmt == "hotpotqa" or fmt == "2wiki":
        return _from_context_records(records, dataset, where)
    if fmt == "musique":
        return _musique(records, where, include_unanswerable)
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


def load_file(source: Source, dataset: str, fields: Fields | None = None,
              include_unanswerable: bool = False) -> QAData:
    """A user file or in-memory dataset in the official layout of `dataset`, or a question list (detected
    from its fields, after ``fields`` renamed them)."""
    check_fields(fields, sorted({n for names in FIELDS.values() for n in names}), "QA data")
    records = read_records(source, fields)
    fmt = _detect_format(records, dataset)
    check_fields(fields, FIELDS["context" if fmt in ("hotpotqa", "2wiki") else fmt], f"the {fmt} layout")
    return _parse(records, fmt, dataset, _where(source), include_unanswerable)


def data_dir() -> Path:
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
    path = data_dir() / directory / name
    data = _parse(read_records(path), fmt, dataset, str(path))
    tasks = tuple(replace(t, meta={**t.meta, "split": split}) for t in data.tasks)
    return replace(data, tasks=tasks)


@lru_cache(maxsize=8)
def bundled_corpus(dataset: str | Literal["all"]) -> tuple[Passage, ...]:
    """The pooled paragraphs of every bundled split (and extra corpus file) of `dataset`, or of all sets."""
    from trace_gym.environments.qa.retrieval import load_corpus

    names = [d for d in DATASETS if BUNDLED[d]] if dataset == "all" else [dataset]
    passages: list[Passage] = []
    for name in names:
        _check_dataset(name)
        for split in BUNDLED[name]:
            passages.extend(load_bundled(name, split).passages)
        for directory, file in _BUNDLED_CORPORA.get(name, ()):
            passages.extend(load_corpus(data_dir() / directory / file))
    return tuple(dedupe(passages))


def load_from_hub(dataset: str, split: str, hub_id: str | None = None, config: str | None = None,
                  fields: Fields | None = None, include_unanswerable: bool = False) -> QAData:
    """Download through HF `datasets` (optional dependency, network); only on an explicit from_hub=True."""
    _check_dataset(dataset)
    try:
        import datasets
    except ImportError as e:
        raise SetupError(
            "expected the `datasets` package for from_hub=True, got ImportError; fix: pip install datasets, "
            "or pass data_path= to a local file"
        ) from e
    default_id, default_config, fmt = HUB_IDS[dataset]
    ds = datasets.load_dataset(hub_id or default_id, config if hub_id else (config or default_config), split=split)
    where = f"{hub_id or default_id}:{split}"
    records = read_records(ds, fields, where)
    if hub_id:
        fmt = _detect_format(records, dataset)
    return _parse(records, fmt, dataset, where, include_unanswerable)


def load_qa(
    dataset: str,
    split: str | None = None,
    data_path: Source | None = None,
    from_hub: bool = False,
    hub_id: str | None = None,
    fields: Fields | None = None,
    include_unanswerable: bool = False,
) -> QAData:
    """Data in the documented order: `data_path` (a file, a ``datasets.Dataset`` or a list of records), else
    the bundled sample, else the hub if `from_hub`."""
    _check_dataset(dataset)
    if data_path is not None:
        return load_file(data_path, dataset, fields, include_unanswerable)
    if from_hub:
        default = "test" if dataset == "bamboogle" else "train"
        return load_from_hub(dataset, split or default, hub_id, fields=fields,
                             include_unanswerable=include_unanswerable)
    if not BUNDLED[dataset]:
        raise ConfigError(
            f"expected data_path= or from_hub=True for {dataset}, got neither; fix: Bamboogle is not bundled "
            "(no offline copy): pass data_path= to a JSON/JSONL file of {Question, Answer} records"
        )
    return load_bundled(dataset, split or next(iter(BUNDLED[dataset])))
