"""BM25 retrieval: bm25s against rank-bm25, the disk and process caches, corpus files, the tool's output."""

from __future__ import annotations

import copy
import json
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

from trace_gym.environments.qa.data import bundled_corpus, load_bundled
from trace_gym.environments.qa.retrieval import (
    BM25Index,
    BM25Settings,
    Passage,
    SearchEngine,
    Tokenizer,
    cache_root,
    clear_memory_cache,
    corpus_key,
    format_passages,
    get_index,
    load_corpus,
    passage_text,
)
from trace_gym.errors import ToolError


class Reference:
    """rank-bm25's BM25Okapi on our tokens, with the document frequencies needed to spot floored terms."""

    def __init__(self, passages: list[Passage], bm25: BM25Settings):
        self.tok = Tokenizer(bm25)
        tokens = [self.tok(passage_text(p)) for p in passages]
        self.okapi = BM25Okapi(tokens, k1=bm25.k1, b=bm25.b)
        self.n = len(tokens)
        self.df = Counter(t for d in tokens for t in set(d))

    def unfloored(self, query: list[str]) -> list[str]:
        """Drop terms in more than half the documents: rank-bm25 floors their negative IDF, bm25s zeroes it."""
        return [t for t in query if math.log(self.n - self.df[t] + 0.5) - math.log(self.df[t] + 0.5) >= 0]


def _assert_topk_agrees(hits: list[tuple[int, float]], ref: np.ndarray, k: int) -> None:
    """Tie-aware: every returned passage scores at least the reference's k-th best, and none is missing."""
    positive = np.sort(ref[ref > 0])[::-1]
    assert len(hits) == min(k, len(positive))
    if not hits:
        return
    kth = positive[len(hits) - 1]
    for i, _ in hits:
        assert ref[i] >= kth - 1e-4 * max(1.0, kth)
    # The reference's strictly better passages must all be present.
    must = set(np.flatnonzero(ref > kth + 1e-4 * max(1.0, kth)).tolist())
    assert must <= {i for i, _ in hits}


_FILLERS = [Passage(f"F{i}", f"filler text number {i}") for i in range(4)]


@pytest.fixture(scope="module")
def musique_corpus() -> list[Passage]:
    return list(bundled_corpus("musique"))


def test_scores_equal_rank_bm25_on_real_corpus(musique_corpus: list[Passage]) -> None:
    bm = BM25Settings()
    index = BM25Index.build(musique_corpus, bm)
    ref = Reference(musique_corpus, bm)
    for task in load_bundled("musique", "train").tasks[:60]:
        query = ref.unfloored(ref.tok(task.prompt))
        # bm25s' Robertson term weight omits BM25Okapi's constant factor (k1 + 1): same ranking.
        ours = index.scores_for_tokens(query) * (bm.k1 + 1)
        np.testing.assert_allclose(ours, ref.okapi.get_scores(query), rtol=1e-4, atol=1e-4)


def test_topk_agrees_with_rank_bm25_on_questions(musique_corpus: list[Passage]) -> None:
    bm = BM25Settings()
    index = BM25Index.build(musique_corpus, bm)
    ref = Reference(musique_corpus, bm)
    checked = 0
    for task in load_bundled("musique", "train").tasks:
        query = ref.unfloored(ref.tok(task.prompt))
        if query:
            _assert_topk_agrees(index.search_tokens(query, 5), ref.okapi.get_scores(query), 5)
            checked += 1
    assert checked >= 90


def test_search_tokenises_queries_like_the_corpus(musique_corpus: list[Passage]) -> None:
    index = BM25Index.build(musique_corpus)
    for task in load_bundled("musique", "train").tasks[:20]:
        assert index.search(task.prompt, 5) == index.search_tokens(index.tokenize(task.prompt), 5)


_WORDS = st.sampled_from(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"])


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.lists(_WORDS, min_size=1, max_size=12), min_size=3, max_size=25),
    query=st.lists(_WORDS, min_size=1, max_size=4),
    k=st.integers(1, 6),
)
def test_topk_agrees_with_rank_bm25_on_random_corpora(docs: list[list[str]], query: list[str], k: int) -> None:
    bm = BM25Settings(stopwords="none", stemmer="none")
    passages = [Passage("", " ".join(d)) for d in docs]
    index = BM25Index.build(passages, bm)
    ref = Reference(passages, bm)
    q = ref.unfloored(query)
    if not q:
        assert index.search_tokens(q, k) == []
        return
    _assert_topk_agrees(index.search_tokens(q, k), ref.okapi.get_scores(q), k)


def test_cached_index_reloads_from_disk_and_equals(tmp_path, musique_corpus: list[Passage]) -> None:
    clear_memory_cache()
    built = get_index(musique_corpus, cache_dir=tmp_path)
    assert built.source == "built"
    assert (tmp_path / "bm25" / built.key / "trace_gym_meta.json").exists()
    clear_memory_cache()
    loaded = get_index(musique_corpus, cache_dir=tmp_path)
    assert loaded.source == "disk" and loaded is not built
    for task in load_bundled("musique", "train").tasks[:20]:
        np.testing.assert_array_equal(loaded.scores(task.prompt), built.scores(task.prompt))
        assert loaded.search(task.prompt, 5) == built.search(task.prompt, 5)


def test_index_is_shared_within_a_process(tmp_path, musique_corpus: list[Passage]) -> None:
    a = get_index(musique_corpus, cache_dir=tmp_path)
    b = get_index(list(musique_corpus), cache_dir=tmp_path / "elsewhere")
    assert a is b
    assert copy.deepcopy(a) is a
    assert copy.deepcopy(SearchEngine(a)).index is a


def test_key_depends_on_content_and_settings(musique_corpus: list[Passage]) -> None:
    base = corpus_key(musique_corpus, BM25Settings())
    assert corpus_key(list(musique_corpus), BM25Settings()) == base
    assert corpus_key(musique_corpus[:-1], BM25Settings()) != base
    edited = [*musique_corpus[:-1], Passage(musique_corpus[-1].title, musique_corpus[-1].text + "!")]
    assert corpus_key(edited, BM25Settings()) != base
    assert corpus_key(musique_corpus, BM25Settings(k1=1.2)) != base


def test_damaged_cache_entry_is_rebuilt(tmp_path) -> None:
    # BM25's IDF is 0 for a term in half the documents: a few fillers give "bananas" a positive one.
    passages = [Passage("A", "apples are red"), Passage("B", "bananas are yellow"), *_FILLERS]
    clear_memory_cache()
    index = get_index(passages, cache_dir=tmp_path)
    (tmp_path / "bm25" / index.key / "trace_gym_meta.json").write_text(json.dumps({"key": "other"}))
    clear_memory_cache()
    again = get_index(passages, cache_dir=tmp_path)
    assert again.source == "built"
    assert again.search("bananas", 1)[0][0] == 1


def test_cache_root_follows_env_var(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("TRACE_GYM_CACHE")
    assert cache_root().parts[-2:] == (".cache", "trace_gym")


def test_tokenizer_keeps_one_character_tokens_and_drops_stopwords() -> None:
    assert Tokenizer(BM25Settings(stemmer="none"))("The 7 dwarfs of X") == ["7", "dwarfs", "x"]
    assert Tokenizer(BM25Settings(stopwords="none", stemmer="none"))("The 7") == ["the", "7"]
    assert Tokenizer(BM25Settings())("running runs") == ["run", "run"]


def test_load_corpus_formats(tmp_path) -> None:
    rows = [{"title": "A", "text": "one"}, {"title": "B", "text": "two"}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "c.json").write_text(json.dumps(rows))
    (tmp_path / "d.json").write_text(json.dumps({"A": ["one", " more"], "B": "two"}))
    (tmp_path / "e.jsonl").write_text(json.dumps({"id": "0", "contents": "\"A\"\none"}))
    want = [Passage("A", "one"), Passage("B", "two")]
    assert load_corpus(tmp_path / "c.jsonl") == want
    assert load_corpus(tmp_path / "c.json") == want
    assert load_corpus(tmp_path / "d.json") == [Passage("A", "one more"), Passage("B", "two")]
    assert load_corpus(tmp_path / "e.jsonl") == [Passage("A", "one")]


def test_search_output_is_numbered_and_truncated() -> None:
    passages = [Passage("Lisbon", "Lisbon is the capital of Portugal. " * 20), Passage("Porto", "Porto is a city."),
                *_FILLERS]
    engine = SearchEngine(BM25Index.build(passages), top_k=2, max_chars=50)
    out = engine("capital Portugal Lisbon city")
    lines = out.split("\n")
    assert lines[0].startswith("Doc 1 (Title: Lisbon) Lisbon is the capital")
    assert lines[0].endswith(" ...") and len(lines[0]) < len("Doc 1 (Title: Lisbon) ") + 60
    assert lines[1] == "Doc 2 (Title: Porto) Porto is a city."
    assert format_passages([passages[1]]) == "Doc 1 (Title: Porto) Porto is a city."


_TINY_ENGINE = SearchEngine(BM25Index.build([Passage("A", "alpha beta"), Passage("B", "gamma delta"), *_FILLERS]), 5)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_search_returns_text_or_says_the_query_is_blank(query: str) -> None:
    if not query.strip():
        with pytest.raises(ToolError, match="empty search query"):
            _TINY_ENGINE(query)
        return
    out = _TINY_ENGINE(query)
    assert isinstance(out, str) and out


def test_top_k_breaks_ties_by_corpus_order_and_skips_zero_scores() -> None:
    from trace_gym.environments.qa.retrieval import _top_k

    scores = np.array([1.0, 2.0, 0.0, 2.0, 2.0, 3.0])
    assert _top_k(scores, 3) == [(5, 3.0), (1, 2.0), (3, 2.0)]
    assert _top_k(scores, 10) == [(5, 3.0), (1, 2.0), (3, 2.0), (4, 2.0), (0, 1.0)]
    assert _top_k(np.zeros(4), 2) == []


def test_a_title_query_lists_that_title_first() -> None:
    """Plain BM25 ranks the short article below longer ones that repeat its name (MuSiQue's "Oklahoma")."""
    passages = [Passage("Wardville, Oklahoma", "Wardville is a town in Oklahoma. Oklahoma Oklahoma."),
                Passage("Grant County, Oklahoma", "Grant County is a county of Oklahoma, in Oklahoma."),
                Passage("Oklahoma", "Oklahoma is a state of the United States, admitted in 1907."), *_FILLERS]
    index = BM25Index.build(passages)
    assert index.search("Oklahoma", 1)[0][0] != 2  # the plain ranking: a longer article first
    assert SearchEngine(index, top_k=1)("oklahoma").startswith("Doc 1 (Title: Oklahoma) ")
    assert not SearchEngine(index, top_k=1, title_first=False)("Oklahoma").startswith("Doc 1 (Title: Oklahoma) ")


def test_the_query_window_shows_the_part_of_a_long_passage_that_matches() -> None:
    text = ("Anna Berg (1 May 1901 - 2 June 1980) was a painter. " + "She painted landscapes of the coast. " * 30
            + "She died of pneumonia in Bergen.")
    passages = [Passage("Anna Berg", text), *_FILLERS]
    index = BM25Index.build(passages)
    head = SearchEngine(index, top_k=1, max_chars=300)("Anna Berg pneumonia")
    focused = SearchEngine(index, top_k=1, max_chars=300, window="query")("Anna Berg pneumonia")
    assert "pneumonia" not in head and "pneumonia" in focused
    assert "Anna Berg (1 May 1901" in focused and " ... She died of pneumonia" in focused
    assert len(focused) <= len("Doc 1 (Title: Anna Berg) ") + 300 + 12


def test_the_query_window_is_the_plain_opening_when_nothing_later_matches() -> None:
    text = "Anna Berg was a painter. " + "She painted landscapes of the coast. " * 30
    engine = SearchEngine(BM25Index.build([Passage("Anna Berg", text), *_FILLERS]), 1, 200, window="query")
    assert engine("Anna Berg") == SearchEngine(engine.index, top_k=1, max_chars=200)("Anna Berg")
