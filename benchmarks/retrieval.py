"""Queries per second of the QA search tool (bm25s) against rank-bm25's BM25Okapi on the same corpus.

The corpus pools every bundled QA paragraph (HotpotQA, 2Wiki, MuSiQue; ~8k) and, past that, repeats it with
perturbations (words dropped and swapped, titles suffixed) to reach the target size. Queries are the bundled
questions. Both sides get the same tokens (the tool's tokenizer, counted in both timings) and return the same
top-k. rank-bm25 is timed on fewer queries at large sizes (it scans every document per query term).
Prints a table and writes benchmarks/results/retrieval.json (``--quick``: retrieval_quick.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from rank_bm25 import BM25Okapi
from rich.console import Console
from rich.table import Table

from trace_gym.environments.qa_data import BUNDLED, bundled_corpus, load_bundled
from trace_gym.environments.retrieval import BM25Index, Passage, SearchEngine, passage_text

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2k and 20k passages only")
    parser.add_argument("--top-k", type=int, default=3)
    args = parser.parse_args()
    sizes = [2_000, 20_000] if args.quick else [2_000, 100_000]
    qs = questions()
    rows = []
    for n in sizes:
        ref_queries = 200 if n <= 2_000 else (40 if n <= 20_000 else 20)
        rows.append(measure(n, qs[:1000], ref_queries, args.top_k))
    table = Table("passages", "top-k", "search tool q/s", "rank-bm25 q/s", "speedup", "build s (bm25s / rank-bm25)",
                  "top-k sets equal*")
    for r in rows:
        table.add_row(f"{r['passages']:,}", str(r["top_k"]), f"{r['qps_search_tool']:,.0f}",
                      f"{r['qps_rank_bm25']:,.1f}", f"{r['speedup']:,.0f}x",
                      f"{r['build_s_bm25s']:.2f} / {r['build_s_rank_bm25']:.2f}", f"{r['topk_sets_equal']:.0%}")
    console = Console(width=130)
    console.print(table)
    console.print("* raw queries; rank-bm25 floors the IDF of terms in > half the documents, so sets can differ"
                  " on such terms (tests compare with them excluded, tie-aware).")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("retrieval_quick.json" if args.quick else "retrieval.json")
    out.write_text(json.dumps({"quick": args.quick, "rows": rows}, indent=2))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
