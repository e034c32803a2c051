"""BM25 retrieval over passages (bm25s), cached on disk and shared within a process.

An index is keyed by the sha256 of its corpus content plus its settings. `get_index` returns the same
immutable `BM25Index` object to every caller in a process (an RL run creates many envs), loads it from
``<cache>/bm25/<key>/`` when another process already built it, and builds and saves it otherwise. The cache
root is the `cache_dir` argument, else ``$TRACE_GYM_CACHE``, else ``~/.cache/trace_gym``.

Deviation from bm25s defaults, on purpose: tokenisation is ours (one function for corpus and queries, so
rank-bm25 can be fed the very same tokens in tests), with explicit stopwords and a token pattern that keeps
one-character tokens (bm25s' default drops them, losing "7", "X", "J").

What the search tool (`SearchEngine`) shows, beyond the index's BM25 ranking (measured in
benchmarks/retrieval.py; figures in docs/rewards.md):
1. A query that is exactly a title (same tokens) lists that title's paragraphs first: plain BM25 ranks
   "Oklahoma" below "Wardville, Oklahoma" and the like, so a title query missed its own article.
2. A paragraph longer than ``max_chars`` (default 1,000) shows its first ``max_chars`` characters
   (``window="head"``), or its opening plus the later span that best matches the query (``"query"``). At 600
   characters the head hid a question's gold answer from its own supporting paragraph in 7% of 2Wiki and 9%
   of MuSiQue cases; at 1,000 in 3.1% and 0%. The query window halves MuSiQue's misses at 600 with per-hop
   queries but is no better at 1,000 and slightly worse with whole questions, so the head is the default.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np

from trace_gym.environments.records import read_json
from trace_gym.errors import ConfigError, DataError, ToolError

__all__ = [
    "BM25Index",
    "BM25Settings",
    "Passage",
    "SearchEngine",
    "Tokenizer",
    "cache_root",
    "clear_memory_cache",
    "corpus_key",
    "format_passages",
    "get_index",
    "load_corpus",
    "query_window",
    "truncate",
]

_FORMAT_VERSION = 1  # bump when the on-disk layout or tokenisation changes


@dataclass(frozen=True)
class Passage:
    """One retrievable paragraph."""

    title: str
    text: str


@dataclass(frozen=True)
class BM25Settings:
    """Index settings; all of them are part of the cache key."""

    method: Literal["robertson", "lucene", "atire", "bm25l", "bm25+"] = "robertson"
    """BM25 variant of bm25s; "robertson" ranks as rank-bm25's BM25Okapi (up to its IDF floor)."""
    k1: float = 1.5
    """Term-frequency saturation."""
    b: float = 0.75
    """Length normalisation."""
    stopwords: Literal["en", "none"] = "en"
    """"en" drops bm25s' 33 English stopwords (articles, prepositions, auxiliaries)."""
    token_pattern: str = r"(?u)\b\w+\b"
    """Regex whose matches (on lowercased text) are the tokens; keeps one-character tokens."""
    stemmer: Literal["english", "none"] = "english"
    """Snowball stemmer of PyStemmer, or none."""

    def __post_init__(self) -> None:
        if self.method not in ("robertson", "lucene", "atire", "bm25l", "bm25+"):
            raise ConfigError(f"expected method in robertson/lucene/atire/bm25l/bm25+, got {self.method!r}")
        if self.stopwords not in ("en", "none"):
            raise ConfigError(f"expected stopwords 'en' or 'none', got {self.stopwords!r}")
        if self.stemmer not in ("english", "none"):
            raise ConfigError(f"expected stemmer 'english' or 'none', got {self.stemmer!r}")
        try:
            re.compile(self.token_pattern)
        except re.error as e:
            raise ConfigError(f"expected a valid regex for token_pattern, got {self.token_pattern!r}: {e}") from e


class Tokenizer:
    """Lowercase, regex tokens, stopword removal, optional stemming; used for corpus and queries alike."""

    def __init__(self, settings: BM25Settings) -> None:
        self._pattern = re.compile(settings.token_pattern)
        if settings.stopwords == "en":
            from bm25s.stopwords import STOPWORDS_EN

            self._stop: frozenset[str] = frozenset(STOPWORDS_EN)
        else:
            self._stop = frozenset()
        self._stem_cache: dict[str, str] = {}
        self._stemmer: Any = None
        if settings.stemmer == "english":
            import Stemmer

            self._stemmer = Stemmer.Stemmer("english")

    def __call__(self, text: str) -> list[str]:
        words = [w for w in self._pattern.findall(text.lower()) if w not in self._stop]
        if self._stemmer is None:
            return words
        cache = self._stem_cache
        out = []
        for w in words:
            s = cache.get(w)
            if s is None:
                # Bounded: a query stream of fuzzed garbage must not grow the cache without limit.
                s = self._stemmer.stemWord(w)
                if len(cache) < 1_000_000:
                    cache[w] = s
            out.append(s)
        return out

    def many(self, texts: Iterable[str]) -> list[list[str]]:
        return [self(t) for t in texts]


def passage_text(p: Passage) -> str:
    """What gets indexed: the title is part of the passage (queries often name the entity)."""
    return f"{p.title}\n{p.text}"


def corpus_key(passages: Sequence[Passage], settings: BM25Settings) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"v": _FORMAT_VERSION, **asdict(settings)}, sort_keys=True).encode())
    for p in passages:
        h.update(p.title.encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
        h.update(p.text.encode("utf-8", "surrogatepass"))
        h.update(b"\x1e")
    return h.hexdigest()


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("TRACE_GYM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "trace_gym"


class BM25Index:
    """An immutable BM25 index over `passages`; `search` returns (passage index, score) best first."""

    def __init__(self, passages: Sequence[Passage], settings: BM25Settings, key: str, bm25: Any, source: str):
        self.passages: tuple[Passage, ...] = tuple(passages)
        self.settings = settings
        self.key = key
        self.source = source  # "built" or "disk": where this object's scores came from
        self._bm25 = bm25
        self._tokenizer = Tokenizer(settings)
        self._lock = threading.Lock()  # the stem cache is the only mutable part

    def __len__(self) -> int:
        return len(self.passages)

    def __deepcopy__(self, memo: dict[int, Any]) -> BM25Index:
        return self  # shared and immutable: snapshots must never copy it

    def __copy__(self) -> BM25Index:
        return self

    @classmethod
    def build(cls, passages: Sequence[Passage], settings: BM25Settings = BM25Settings()) -> BM25Index:
        import bm25s

        if not passages:
            raise ConfigError("expected a non-empty corpus, got 0 passages; fix: pass passages or a corpus file")
        tok = Tokenizer(settings)
        tokens = [tok(passage_text(p)) for p in passages]
        bm25 = bm25s.BM25(method=settings.method, k1=settings.k1, b=settings.b)
        bm25.index(tokens, show_progress=False)
        return cls(passages, settings, corpus_key(passages, settings), bm25, "built")

    def save(self, directory: str | os.PathLike[str]) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._bm25.save(str(directory), show_progress=False)
        meta = {"key": self.key, "n_passages": len(self.passages), "settings": asdict(self.settings)}
        (directory / "trace_gym_meta.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, directory: str | os.PathLike[str], passages: Sequence[Passage], settings: BM25Settings) -> BM25Index:
        """Load scores saved by `save`; raises ValueError if they belong to another corpus or settings."""
        import bm25s

        directory = Path(directory)
        meta = json.loads((directory / "trace_gym_meta.json").read_text())
        key = corpus_key(passages, settings)
        if meta.get("key") != key or meta.get("n_passages") != len(passages):
            raise ValueError(f"index in {directory} is for another corpus (key {meta.get('key')}, want {key})")
        bm25 = bm25s.BM25.load(str(directory), load_vocab=True, show_progress=False, verbosity=0)
        return cls(passages, settings, key, bm25, "disk")

    def tokenize(self, text: str) -> list[str]:
        with self._lock:
            return self._tokenizer(text)

    @cached_property
    def _titles(self) -> dict[tuple[str, ...], list[int]]:
        out: dict[tuple[str, ...], list[int]] = {}
        for i, p in enumerate(self.passages):
            out.setdefault(tuple(self.tokenize(p.title)), []).append(i)
        return out

    def title_matches(self, tokens: Sequence[str]) -> list[int]:
        """Passages whose title has exactly these tokens (in corpus order)."""
        return list(self._titles.get(tuple(tokens), ())) if tokens else []

    @cached_property
    def _df(self) -> dict[str, int]:
        indptr = self._bm25.scores["indptr"]
        return {t: int(indptr[i + 1] - indptr[i]) for t, i in self._bm25.vocab_dict.items() if i + 1 < len(indptr)}

    def idf(self, token: str) -> float:
        """BM25 (Lucene) inverse document frequency of a token; 0 for one the corpus lacks."""
        df = self._df.get(token, 0)
        return math.log(1 + (len(self.passages) - df + 0.5) / (df + 0.5)) if df else 0.0

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for `query` (zeros when no query token is in the vocabulary)."""
        return self.scores_for_tokens(self.tokenize(query))

    def scores_for_tokens(self, tokens: Sequence[str]) -> np.ndarray:
        vocab = self._bm25.vocab_dict
        ids = [vocab[t] for t in tokens if t in vocab]
        n = len(self.passages)
        if not ids:
            return np.zeros(n)
        # Sum the query terms' columns of bm25s' precomputed sparse score matrix; one bincount is several
        # times faster than bm25s' per-term np.add.at on small corpora.
        m = self._bm25.scores
        indptr, indices, data = m["indptr"], m["indices"], m["data"]
        rows = np.concatenate([indices[indptr[i] : indptr[i + 1]] for i in ids])
        weights = np.concatenate([data[indptr[i] : indptr[i + 1]] for i in ids])
        scores = np.bincount(rows, weights=weights, minlength=n).astype(float, copy=False)  # float64 already: no copy
        if self._bm25.nonoccurrence_array is not None:  # bm25l / bm25+ score absent terms too
            scores += float(self._bm25.nonoccurrence_array[ids].sum())
        return scores

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """Top-`k` (passage index, score) with a positive score, best first, ties broken by corpus order."""
        return _top_k(self.scores(query), k)

    def search_tokens(self, tokens: Sequence[str], k: int) -> list[tuple[int, float]]:
        return _top_k(self.scores_for_tokens(tokens), k)


def _top_k(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Best `k` positive scores; equal scores in corpus order, also at the k-th place."""
    cand = np.flatnonzero(scores > 0)
    if k <= 0 or not len(cand):
        return []
    vals = scores[cand]
    if len(cand) > k:
        kth = np.partition(vals, len(vals) - k)[len(vals) - k]
        better = cand[vals > kth]
        cand = np.concatenate([better, cand[vals == kth][: k - len(better)]])
        vals = scores[cand]
    order = np.lexsort((cand, -vals))
    return [(int(cand[i]), float(vals[i])) for i in order]


_INDEXES: dict[str, BM25Index] = {}
_INDEXES_LOCK = threading.Lock()


def get_index(
    passages: Sequence[Passage],
    settings: BM25Settings = BM25Settings(),
    cache_dir: str | os.PathLike[str] | None = None,
    use_disk: bool = True,
) -> BM25Index:
    """The process-wide index for this corpus content: memory, then disk cache, then a fresh build."""
    key = corpus_key(passages, settings)
    with _INDEXES_LOCK:
        index = _INDEXES.get(key)
        if index is not None:
            return index
        directory = cache_root(cache_dir) / "bm25" / key
        if use_disk and (directory / "trace_gym_meta.json").exists():
            # A damaged or foreign cache entry is rebuilt, not trusted.
            with contextlib.suppress(Exception):
                index = BM25Index.load(directory, passages, settings)
        if index is None:
            index = BM25Index.build(passages, settings)
            if use_disk:
                _save_atomically(index, directory)
        _INDEXES[key] = index
        return index


def clear_memory_cache() -> None:
    """Forget the process-wide indexes (the disk cache stays); the next `get_index` loads or rebuilds."""
    with _INDEXES_LOCK:
        _INDEXES.clear()


def _save_atomically(index: BM25Index, directory: Path) -> None:
    """Write into a sibling temp dir and rename, so concurrent processes never read a half-written index."""
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    except OSError:
        return  # read-only or missing cache location: the in-memory index still works
    try:
        index.save(tmp)
        if directory.exists():
            shutil.rmtree(directory, ignore_errors=True)
        os.replace(tmp, directory)
    except OSError:
        pass  # another process won the race, or the disk is full; either way nothing to do
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_corpus(path: str | os.PathLike[str]) -> list[Passage]:
    """Read a corpus: JSONL or a JSON array of {"title", "text"}, or a JSON object title -> text/sentences.

    Records with "contents" ("title\\ntext", the pyserini/FlashRAG layout) are accepted too.
    """
    records = read_json(path)
    if isinstance(records, dict):
        if "text" in records or "contents" in records:
            records = [records]  # a one-line JSONL file
        else:
            records = [{"title": t, "text": v} for t, v in records.items()]
    if not isinstance(records, list):
        raise DataError(f"expected a list of passages in {path}, got {type(records).__name__}; fix: a JSON array "
                        "or JSON Lines of {title, text}")
    out: list[Passage] = []
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise DataError(f"expected a JSON object per passage in {path}, got {type(r).__name__} at {i}; fix: "
                            "one {title, text} object per passage")
        if "text" in r:
            text = r["text"]
            title = r.get("title", "")
        elif "contents" in r:
            title, _, text = str(r["contents"]).partition("\n")
            title = r.get("title", title)
        else:
            raise DataError(f"expected keys title/text in {path} record {i}, got {sorted(r)}; fix: rename the "
                            "fields to title and text (or contents)")
        if isinstance(text, list):
            text = join_sentences(text)
        out.append(Passage(str(title).strip('"'), str(text)))
    if not out:
        raise DataError(f"expected at least one passage in {path}, got none; fix: check the file")
    return out


def join_sentences(sentences: Sequence[str]) -> str:
    """HotpotQA sentences carry their own leading space; 2Wiki's do not."""
    text = ""
    for s in sentences:
        if text and not text[-1].isspace() and s and not s[0].isspace():
            text += " "
        text += s
    return text.strip()


def dedupe(passages: Iterable[Passage]) -> list[Passage]:
    """Drop exact duplicates, keeping first-seen order (pooled contexts repeat paragraphs)."""
    seen: set[Passage] = set()
    out = []
    for p in passages:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def truncate(text: str, max_chars: int) -> str:
    """The first ``max_chars`` characters, cut at a word, with " ..." when anything was cut."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    space = cut.rfind(" ")
    if space > max_chars // 2:
        cut = cut[:space]
    return cut.rstrip() + " ..."


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def query_window(text: str, max_chars: int, weights: dict[str, float], tokenize: Any) -> str:
    """The opening of ``text`` and, when a later sentence span matches the query better than what the opening
    shows, that span: each half of ``max_chars``. ``weights`` maps query tokens to their IDF; ``tokenize`` is
    the index's tokenizer. Falls back to `truncate` when nothing later matches."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    half = max_chars // 2
    head = truncate(text, max_chars)
    shown = set(tokenize(head))
    best, start = 0.0, -1
    for m in _SENTENCE_END.finditer(text):
        if m.end() + half <= len(head) - 4:
            continue  # this span is already visible in the plain opening
        span = set(tokenize(text[m.end(): m.end() + half]))
        score = sum(w for t, w in weights.items() if t in span and t not in shown)
        if score > 0 and score >= best - 1e-9:  # ties: the latest start, so the span opens on the match
            best, start = score, m.end()
    if start < 0:
        return head
    lead = truncate(text[:start].rstrip(), max_chars - half)
    return lead.removesuffix(" ...") + " ... " + truncate(text[start:], half)


def format_passages(passages: Sequence[Passage], max_chars: int = 0, texts: Sequence[str] | None = None) -> str:
    """Numbered passages, 'Doc 1 (Title: ...) text', one per line (``texts``: what to show of each, if given)."""
    shown = texts if texts is not None else [truncate(p.text, max_chars) for p in passages]
    return "\n".join(f"Doc {i} (Title: {p.title}) {t}" for i, (p, t) in enumerate(zip(passages, shown), 1))


class SearchEngine:
    """The search tool's behaviour: query text in, numbered passages out. A blank query is the model's mistake
    (``ToolError``, which the env answers with an error observation); nothing else raises on a query.

    ``title_first``: passages titled exactly as the query come first. ``window``: "query" shows a long
    passage's opening plus its part that best matches the query; "head" only its first ``max_chars``."""

    def __init__(self, index: BM25Index, top_k: int = 3, max_chars: int = 1000, max_query_chars: int = 2000,
                 title_first: bool = True, window: Literal["head", "query"] = "head"):
        if top_k < 1:
            raise ConfigError(f"expected top_k >= 1, got {top_k}")
        if window not in ("head", "query"):
            raise ConfigError(f"expected window 'head' or 'query', got {window!r}")
        self.index = index
        self.top_k = top_k
        self.max_chars = max_chars
        self.max_query_chars = max_query_chars
        self.title_first = title_first
        self.window = window

    def __deepcopy__(self, memo: dict[int, Any]) -> SearchEngine:
        return self  # immutable settings around a shared index

    def ranked(self, query: str, k: int | None = None) -> list[int]:
        """Passage indices the tool shows for ``query``, best first."""
        k = self.top_k if k is None else k
        tokens = self.index.tokenize(query)
        scores = self.index.scores_for_tokens(tokens)
        first = self.index.title_matches(tokens) if self.title_first else []
        first = sorted(first, key=lambda i: (-scores[i], i))[:k]
        taken = set(first)
        rest = [i for i, _ in _top_k(scores, k + len(first)) if i not in taken]
        return (first + rest)[:k]

    def show(self, passage: Passage, query: str) -> str:
        """What the tool shows of one passage for ``query``."""
        if self.window == "head":
            return truncate(passage.text, self.max_chars)
        weights = {t: self.index.idf(t) for t in set(self.index.tokenize(query))}
        return query_window(passage.text, self.max_chars, weights, self.index.tokenize)

    def __call__(self, query: str) -> str:
        query = str(query)[: self.max_query_chars]
        if not query.strip():
            raise ToolError("empty search query; write the words to search for")
        hits = [self.index.passages[i] for i in self.ranked(query)]
        if not hits:
            return f"No passages found for {query!r}; try other keywords."
        return format_passages(hits, texts=[self.show(p, query) for p in hits])
