"""The QA search tool: speed against rank-bm25, recall of supporting paragraphs, and what a passage shows.

1. speed: queries per second of the search tool (bm25s) against rank-bm25's BM25Okapi on the same corpus. The
   corpus pools every bundled QA paragraph (HotpotQA, 2Wiki, MuSiQue; ~8k) and, past that, repeats it with
   perturbations (words dropped and swapped, titles suffixed) to reach the target size. Queries are the bundled
   questions. Both sides get the same tokens (the tool's tokenizer, counted in both timings) and return the same
   top-k. rank-bm25 is timed on fewer queries at large sizes (it scans every document per query term).
2. recall: share of supporting paragraphs (the bundled train samples' supporting facts) in the top 3 and top 10,
   with the question as the query and with the paragraph's title as the query; plain BM25 ranking against the
   tool's (exact-title matches first). Each dataset's own pooled corpus is the index.
3. window: how often an answer present in its supporting paragraph is cut from what the tool shows of that
   paragraph: the first N characters ("head") against the opening plus the best-matching span ("query"),
   N = 200 to 1000. Two views: the question's gold answer in its supporting paragraphs, the question as the
   query; and each hop's answer in the hop's paragraph, with the question or the hop's own query as the query
   (2Wiki: the evidence's subject and relation, "Edward Ludwig place of death"; MuSiQue: the decomposition's
   sub-question with the earlier answers filled in). Also the mean characters shown per passage.
Prints a table per study and writes benchmarks/results/retrieval.json (``--quick``: retrieval_quick.json).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
from rank_bm25 import BM25Okapi
from rich.console import Console
from rich.table import Table

from trace_gym.environments.qa.data import BUNDLED, bundled_corpus, data_dir, load_bundled
from trace_gym.environments.qa.retrieval import (
    BM25Index,
    Passage,
    SearchEngine,
    get_index,
    join_sentences,
    passage_text,
)
from trace_gym.environments.records import read_records

RESULTS = Path(__file__).parent / "results"


def corpus_of_size(n: int, seed: int = 0) -> list[Passage]:
    base = list(bundled_corpus("all"))
    out = base[:n]
    rng = np.random.default_rng(seed)
    copy = 1
    while len(out) < n:
        for p in base[: n - len(out)]:
            words = p.text.split()
            keep = [w for w in words if rng.random() > 0.1] or words
            if len(keep) > 3:
                i = int(rng.integers(len(keep) - 1))
                keep[i], keep[i + 1] = keep[i + 1], keep[i]
            out.append(Passage(f"{p.title} ({copy})", " ".join(keep)))
        copy += 1
    return out


def questions() -> list[str]:
    return [t.prompt for d, splits in BUNDLED.items() for s in splits for t in load_bundled(d, s).tasks]


def measure(n: int, queries: list[str], ref_queries: int, top_k: int) -> dict:
    passages = corpus_of_size(n)
    start = time.perf_counter()
    index = BM25Index.build(passages)
    build_ours = time.perf_counter() - start
    engine = SearchEngine(index, top_k=top_k)

    start = time.perf_counter()
    tokens = [index.tokenize(passage_text(p)) for p in passages]
    okapi = BM25Okapi(tokens, k1=index.settings.k1, b=index.settings.b)
    build_ref = time.perf_counter() - start

    engine(queries[0])  # warm the stem cache path once, as a running env would be
    start = time.perf_counter()
    for q in queries:
        engine(q)
    ours = len(queries) / (time.perf_counter() - start)

    ref_tops = []
    start = time.perf_counter()
    for q in queries[:ref_queries]:
        scores = okapi.get_scores(index.tokenize(q))
        ref_tops.append(set(np.argsort(-scores, kind="stable")[:top_k].tolist()))
    ref = ref_queries / (time.perf_counter() - start)
    agree = sum(top == {i for i, _ in index.search(q, top_k)} for q, top in zip(queries, ref_tops))
    return {
        "passages": n, "top_k": top_k, "queries_ours": len(queries), "queries_rank_bm25": ref_queries,
        "qps_search_tool": ours, "qps_rank_bm25": ref, "speedup": ours / ref,
        "build_s_bm25s": build_ours, "build_s_rank_bm25": build_ref,
        "topk_sets_equal": agree / ref_queries,
    }


RECALL_SETS = ("hotpotqa", "2wiki", "musique")


def recall(dataset: str) -> dict:
    """Share of supporting paragraphs ranked in the top k, per query kind and ranking."""
    data = load_bundled(dataset, "train")
    corpus = bundled_corpus(dataset)
    position = {p: i for i, p in enumerate(corpus)}
    index = get_index(corpus)
    rankings = {"bm25": SearchEngine(index, title_first=False), "tool": SearchEngine(index)}
    pairs = [(t.prompt, p) for t in data.tasks for p in data.support.get(t.id, ()) if p in position]
    row: dict = {"dataset": dataset, "paragraphs": len(pairs),
                 "titles_shared": sum(n > 1 for n in Counter(p.title for p in corpus).values())}
    for name, engine in rankings.items():
        for kind in ("question", "title"):
            top = {q: engine.ranked(q, 10) for q in {(q if kind == "question" else p.title) for q, p in pairs}}
            for k in (3, 10):
                hits = sum(position[p] in top[q if kind == "question" else p.title][:k] for q, p in pairs)
                row[f"{name}/{kind}@{k}"] = hits / len(pairs)
    return row


def hop_queries(dataset: str) -> list[tuple[str, str, Passage, str]]:
    """(question, hop query, supporting paragraph, the hop's answer) for each hop of the bundled train sample."""
    out = []
    if dataset == "2wiki":
        for r in read_records(data_dir() / "2wikimultihopqa" / "train_500.jsonl"):
            context = {t: Passage(t, join_sentences(s)) for t, s in r["context"]}
            out += [(r["question"], f"{s} {rel}", context[s], str(o)) for s, rel, o in r["evidences"] if s in context]
    else:
        for r in read_records(data_dir() / "musique" / "train_100.json"):
            paragraphs, answers = {p["idx"]: p for p in r["paragraphs"]}, []
            for step in r["question_decomposition"]:
                query = step["question"]
                for j, a in enumerate(answers):
                    query = query.replace(f"#{j + 1}", a)
                answers.append(step["answer"])
                p = paragraphs.get(step["paragraph_support_idx"])
                if p is not None:
                    out.append((r["question"], query, Passage(p["title"], p["paragraph_text"]), step["answer"]))
    return out


def window(dataset: str) -> list[dict]:
    hops = [h for h in hop_queries(dataset) if h[3].lower() in h[2].text.lower()]
    data = load_bundled(dataset, "train")
    # The question's own gold answer in the supporting paragraphs that contain it (a perfect retrieval's view).
    finals = [(t.prompt, t.prompt, p, t.answer[0]) for t in data.tasks for p in data.support.get(t.id, ())
              if t.answer[0].lower() in p.text.lower()]
    index = get_index(bundled_corpus(dataset))
    rows = []
    for mode in ("head", "query"):
        for n in (200, 400, 600, 800, 1000):
            engine = SearchEngine(index, max_chars=n, window=mode)
            row: dict = {"dataset": dataset, "window": mode, "max_chars": n, "hops": len(hops), "finals": len(finals)}
            for kind, cases in (("final", finals), ("question", hops), ("hop", hops)):
                shown = [engine.show(p, hop if kind == "hop" else q) for q, hop, p, _ in cases]
                row[f"hidden/{kind}"] = sum(a.lower() not in s.lower() for s, (*_, a) in zip(shown, cases)) / len(cases)
                row[f"chars/{kind}"] = float(np.mean([len(s) for s in shown]))
            rows.append(row)
    return rows


def print_recall(console: Console, rows: list[dict]) -> None:
    table = Table("dataset", "supporting paragraphs", "titles shared", "ranking", "question@3", "question@10",
                  "title@3", "title@10", title="Recall of supporting paragraphs")
    for r in rows:
        for name in ("bm25", "tool"):
            table.add_row(r["dataset"], str(r["paragraphs"]), str(r["titles_shared"]),
                          "plain BM25" if name == "bm25" else "tool (exact title first)",
                          *(f"{r[f'{name}/{kind}@{k}']:.3f}" for kind in ("question", "title") for k in (3, 10)))
    console.print(table)


def print_window(console: Console, rows: list[dict]) -> None:
    table = Table("dataset", "window", "max chars", "final answer hidden, question query", "hops",
                  "hop answer hidden, question query", "hop answer hidden, hop query", "chars shown (hop query)",
                  title="Answer cut from its supporting paragraph")
    for r in rows:
        table.add_row(r["dataset"], r["window"], str(r["max_chars"]), f"{r['hidden/final']:.1%} of {r['finals']}",
                      str(r["hops"]), f"{r['hidden/question']:.1%}", f"{r['hidden/hop']:.1%}", f"{r['chars/hop']:.0f}")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2k and 20k passages only")
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--study", choices=("all", "speed", "recall", "window"), default="all")
    args = parser.parse_args()
    console = Console(width=140)
    results: dict = {"quick": args.quick}
    if args.study in ("all", "recall"):
        results["recall"] = [recall(d) for d in RECALL_SETS]
        print_recall(console, results["recall"])
    if args.study in ("all", "window"):
        results["window"] = [r for d in ("2wiki", "musique") for r in window(d)]
        print_window(console, results["window"])
    if args.study in ("all", "speed"):
        results["rows"] = speed(args.quick, args.top_k, console)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "retrieval" if args.study == "all" else f"retrieval_{args.study}"
    out = RESULTS / (f"{name}_quick.json" if args.quick else f"{name}.json")
    out.write_text(json.dumps(results, indent=2))
    console.print(f"wrote {out}")


def speed(quick: bool, top_k: int, console: Console) -> list[dict]:
    sizes = [2_000, 20_000] if quick else [2_000, 100_000]
    qs = questions()
    rows = []
    for n in sizes:
        ref_queries = 200 if n <= 2_000 else (40 if n <= 20_000 else 20)
        rows.append(measure(n, qs[:1000], ref_queries, top_k))
    table = Table("passages", "top-k", "search tool q/s", "rank-bm25 q/s", "speedup", "build s (bm25s / rank-bm25)",
                  "top-k sets equal*")
    for r in rows:
        table.add_row(f"{r['passages']:,}", str(r["top_k"]), f"{r['qps_search_tool']:,.0f}",
                      f"{r['qps_rank_bm25']:,.1f}", f"{r['speedup']:,.0f}x",
                      f"{r['build_s_bm25s']:.2f} / {r['build_s_rank_bm25']:.2f}", f"{r['topk_sets_equal']:.0%}")
    console.print(table)
    console.print("* raw queries; rank-bm25 floors the IDF of terms in > half the documents, so sets can differ"
                  " on such terms (tests compare with them excluded, tie-aware).")
    return rows


if __name__ == "__main__":
    main()
