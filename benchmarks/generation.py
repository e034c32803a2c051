"""Generation throughput and prefix reuse of the policy backends on the tiny model.

1. tokens/s of the transformers backend at batch 1 and 16;
2. K branches from one shared prefix, with and without prefix reuse: prefill tokens computed (target:
   prefix + K suffixes rather than K x (prefix + suffix)) and the wall-time ratio, at prefix lengths 128..2048;
3. with --vllm (run it in .venv-vllm): the vLLM engine's prefix-cache hit rate on the same branched requests.

Usage: python benchmarks/generation.py [--quick] [--size tiny] [--vllm]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from trace_gym.agents.hf import HFPolicy
from trace_gym.agents.policy import Request, SamplingParams
from trace_gym.agents.tiny import build_tiny_model


def throughput(policy: HFPolicy, batch: int, new_tokens: int, repeats: int) -> float:
    sp = SamplingParams(max_new_tokens=new_tokens, min_new_tokens=new_tokens, seed=0)
    reqs = [Request(prompt_ids=[(7 * i + b) % 250 for i in range(32)]) for b in range(batch)]
    policy.generate(reqs[:1], SamplingParams(max_new_tokens=2, seed=0))  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        policy.generate(reqs, sp)
    return repeats * batch * new_tokens / (time.perf_counter() - start)


def branches(model, tokenizer, prefix_len: int, k: int, new_tokens: int, repeats: int) -> dict[str, float]:
    prefix = [(13 * i) % 250 for i in range(prefix_len)]
    sp = SamplingParams(max_new_tokens=new_tokens, min_new_tokens=new_tokens, n=k, seed=0)
    row: dict[str, float] = {"prefix": prefix_len, "k": k}
    for name, share in (("shared", True), ("plain", False)):
        policy = HFPolicy(model, tokenizer, share_prefix=share, max_batch_size=256)
        policy.generate([Request(prompt_ids=prefix)], SamplingParams(max_new_tokens=2, seed=0))
        start = time.perf_counter()
        for _ in range(repeats):
            policy.generate([Request(prompt_ids=prefix)], sp)
        row[f"{name}_s"] = (time.perf_counter() - start) / repeats
        # Prefill tokens plus the K suffixes decoded one token at a time.
        row[f"{name}_tokens"] = policy.stats.prefill_tokens + policy.stats.decode_tokens
    row["speedup"] = row["plain_s"] / row["shared_s"]
    row["work_ratio"] = row["plain_tokens"] / row["shared_tokens"]
    return row


def vllm_hit_rates(model_dir: Path, lengths: list[int], k: int, new_tokens: int) -> list[dict[str, float]]:
    from trace_gym.agents.vllm import VLLMPolicy

    engine = VLLMPolicy.from_pretrained(model_dir, dtype="float32", max_model_len=max(lengths) + 256,
                                        enforce_eager=True)
    rows = []
    for length in lengths:
        prefix = [(17 * i + length) % 250 for i in range(length)]
        engine.generate([Request(prompt_ids=prefix)], SamplingParams(max_new_tokens=1, seed=0))  # the root
        engine.generate([Request(prompt_ids=prefix)] * k, SamplingParams(max_new_tokens=new_tokens, seed=1))
        stats = engine.last_prefix_cache
        rows.append({"prefix": length, "k": k, "queries": stats.queries, "hits": stats.hits,
                     "hit_rate": stats.hit_rate})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer lengths and repeats (CI)")
    parser.add_argument("--size", choices=["nano", "tiny"], default="tiny")
    parser.add_argument("--k", type=int, default=8, help="branches per prefix")
    parser.add_argument("--vllm", action="store_true", help="also measure the vLLM prefix-cache hit rate")
    parser.add_argument("--out", default="benchmarks/results/generation.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    lengths = [128, 512] if args.quick else [128, 256, 512, 1024, 2048]
    repeats = 1 if args.quick else 3
    new_tokens = 16 if args.quick else 32
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / args.size, size=args.size, seed=0)
        policy = HFPolicy.from_pretrained(model_dir, dtype=torch.float32)
        result: dict = {"size": args.size, "threads": torch.get_num_threads(), "throughput": {}, "branches": []}
        print(f"transformers backend, {args.size} model, {torch.get_num_threads()} threads")
        print(f"{'batch':>6} {'tokens/s':>10}")
        for batch in (1, 16):
            tps = throughput(policy, batch, new_tokens * 2, repeats)
            result["throughput"][str(batch)] = tps
            print(f"{batch:>6} {tps:>10.0f}")
        print(f"\n{args.k} branches of {new_tokens} tokens from one prefix (tokens = prefill + decode)")
        print(f"{'prefix':>6} {'shared_tok':>10} {'plain_tok':>10} {'work x':>7} {'shared_s':>9} {'plain_s':>9} "
              f"{'speedup':>7}")
        for length in lengths:
            row = branches(policy.model, policy.tokenizer, length, args.k, new_tokens, repeats)
            result["branches"].append(row)
            print(f"{length:>6} {row['shared_tokens']:>10.0f} {row['plain_tokens']:>10.0f} {row['work_ratio']:>7.2f} "
                  f"{row['shared_s']:>9.3f} {row['plain_s']:>9.3f} {row['speedup']:>7.2f}")
        if args.vllm:
            rows = vllm_hit_rates(model_dir, lengths, args.k, new_tokens)
            result["vllm_prefix_cache"] = rows
            print(f"\nvLLM prefix cache, {args.k} branches after the root request")
            print(f"{'prefix':>6} {'queries':>8} {'hits':>8} {'hit rate':>8}")
            for r in rows:
                print(f"{r['prefix']:>6} {r['queries']:>8} {r['hits']:>8} {r['hit_rate']:>8.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
