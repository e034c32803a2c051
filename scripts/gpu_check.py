"""GPU path check: two TRACE steps of the tiny model with the vLLM backend, weight sync verified.

Run through scripts/gpu_check.sh on a machine with a GPU and the `vllm` extra. `--backend hf --device cpu` is
the dry run: the same steps and checks with the transformers backend, on the CPU.

Checks (exit status 1 if any fails):
1. Each step spends exactly its trajectory budget and, after a warm start (mixed trees), trains on some tokens.
2. After each step's sync, the engine's greedy log-probs on probe prompts equal the trainer model's.
3. After a known weight change (a seeded perturbation of every weight, visible in the model's own log-probs)
   and a sync, the engine's greedy generations and log-probs match the changed model.
4. The policy update on the last step's trees, run both ways (one padded row per node, and tree-packed,
   training/update/packing.py): the packed update's loss, statistics and gradient norm equal the rows'.
Reported: step time per stage, prefix-cache hit rate per stage (vLLM's counters), parameter change per step;
for the update paths (rows, packed with the SDPA mask, packed with flex attention where it runs), tokens run
through the model and wall time per update.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

CHECKS: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str) -> bool:
    CHECKS.append((name, bool(ok), detail))
    print(f"[{'ok' if ok else 'FAIL'}] {name}: {detail}", flush=True)
    return ok


def build_config(args: argparse.Namespace) -> Any:
    from trace_gym.training.config import TrainConfig

    out = Path(args.out)
    return TrainConfig.from_dict({
        "run_dir": str(out / "rl"), "seed": args.seed, "steps": 2,
        "model": {"path": str(out / "model-init"), "init_size": "tiny", "backend": args.backend,
                  "device": args.device, "vllm_gpu_memory_utilization": args.gpu_memory_utilization},
        "sft": {"enabled": args.sft_steps > 0, "output": str(out / "model-sft"), "episodes": args.sft_episodes,
                "steps": max(args.sft_steps, 1), "batch_size": 32, "lr": 2e-3},
        "env": {"id": "trace/Arithmetic-v0", "kwargs": {"n_tasks": 500, "task_seed": 0}, "workers": 4},
        "rollout": {"temperature": 1.0, "max_new_tokens": args.max_new_tokens, "max_context": 768},
        "alloc": {"allocator": "trace", "roots": args.roots, "multiplier": 1, "pool_size": args.roots,
                  "group_size": 8, "cap": 8},
        "optim": {"lr": 1e-3, "mini_batch": 64, "micro_batch": 32, "skip_zero_advantage": True},
        "eval": {"every": 0, "tasks": 0},
        "checkpoint": {"every": 0},
        "log": {"progress": False},
    })


def find_engine(policy: Any) -> Any:
    """The vllm.LLM inside a policy (any attribute with `get_metrics`), or None."""
    for value in vars(policy).values():
        if hasattr(value, "get_metrics") and hasattr(value, "generate"):
            return value
    return None


def prefix_counters(engine: Any) -> tuple[float, float] | None:
    """(queries, hits) of vLLM's prefix cache, in tokens, summed over engines; None when not exported."""
    if engine is None:
        return None
    queries = hits = 0.0
    seen = False
    for metric in engine.get_metrics():
        if metric.name == "vllm:prefix_cache_queries":
            queries += float(metric.value)
            seen = True
        elif metric.name == "vllm:prefix_cache_hits":
            hits += float(metric.value)
    return (queries, hits) if seen else None


class StageMeter:
    """Wraps the collector's stage functions to read the prefix-cache counters around each."""

    def __init__(self, collector: Any, engine: Any):
        self.engine = engine
        self.rates: dict[str, list[float]] = {"bare": [], "branches": []}
        for stage, attr in (("bare", "bare_rollouts"), ("branches", "continuations")):
            setattr(collector, attr, self._wrap(stage, getattr(collector, attr)))

    def _wrap(self, stage: str, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            before = prefix_counters(self.engine)
            out = fn(*args, **kwargs)
            after = prefix_counters(self.engine)
            if before is not None and after is not None:
                queries, hits = after[0] - before[0], after[1] - before[1]
                self.rates[stage].append(hits / queries if queries > 0 else float("nan"))
            return out
        return wrapped


def probe(trainer: Any, prompts: list[list[int]]) -> tuple[list[list[int]], float]:
    """Greedy generations of the engine on `prompts`, and the largest gap between the engine's log-probs and
    the trainer model's on those tokens."""
    import torch

    from trace_gym.agents.policy import Request, SamplingParams
    from trace_gym.training.update.batches import token_logprobs

    sampling = SamplingParams(temperature=0.0, max_new_tokens=16, min_new_tokens=16)
    gens = trainer.policy.generate([Request(prompt_ids=p) for p in prompts], sampling)
    gap = 0.0
    model = trainer.model
    for prompt, gen in zip(prompts, gens):
        ids = torch.tensor([prompt + list(gen.token_ids)], device=trainer.device)
        with torch.no_grad():
            want = token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt):].float().cpu()
        got = torch.tensor(gen.logprobs, dtype=torch.float32)
        gap = max(gap, float((want - got).abs().max()))
    return [list(g.token_ids) for g in gens], gap


def model_logprobs(trainer: Any, prompts: list[list[int]], tokens: list[list[int]]) -> Any:
    """The trainer model's log-probs of `tokens` after each prompt, concatenated (CPU)."""
    import torch

    from trace_gym.training.update.batches import token_logprobs

    out = []
    for prompt, toks in zip(prompts, tokens):
        ids = torch.tensor([prompt + toks], device=trainer.device)
        with torch.no_grad():
            out.append(token_logprobs(trainer.model, ids, torch.ones_like(ids))[0, len(prompt):].float().cpu())
    return torch.cat(out)


def param_vector(model: Any) -> Any:
    import torch

    return torch.cat([p.detach().float().flatten().cpu() for p in model.parameters()])


def update_paths(trainer: Any, trees: list[Any], repeats: int = 3) -> dict[str, Any]:
    """Rows against packed updates (SDPA mask; flex attention where it runs) on ``trees``, each on its own copy
    of the trained model: stats of one update, tokens run through the model, median wall time of ``repeats``.
    Every generated node is trained with a seeded advantage of +-1 (the comparison is about the computation, and
    an untrained model's trees may have none)."""
    import copy

    import torch

    from trace_gym.training.step import build_samples
    from trace_gym.training.update.batches import update_batch
    from trace_gym.training.update.optimizer_step import policy_update
    from trace_gym.training.update.packing import pack_batches, trie_order

    cfg = trainer.cfg
    samples = build_samples({t.task_id: t for t in trees}, cfg.optim.advantage, skip_zero=False).samples
    g = torch.Generator().manual_seed(0)
    for s in samples:
        s.advantage = float(torch.randint(0, 2, (1,), generator=g)) * 2 - 1
    samples = [samples[i] for i in trie_order([s.context + s.action for s in samples], g)]
    device = trainer.device
    paths: dict[str, Any] = {
        "rows": ("sdpa", update_batch(samples, trainer.tokenizer.pad_token_id)),
        "packed_sdpa": ("sdpa", pack_batches(samples, cfg.optim.pack_tokens)),
        "packed_flex": ("flex_attention", pack_batches(samples, cfg.optim.pack_tokens)),
    }
    out: dict[str, Any] = {"nodes": len(samples), "row_tokens": sum(len(s.context) + len(s.action) for s in samples)}
    for name, (attention, batch) in paths.items():
        model = copy.deepcopy(trainer.model)
        try:
            model.set_attn_implementation(attention)
            times = []
            for _ in range(repeats + 1):  # the first: warm-up (and flex attention's compilation)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                stats = policy_update(model, optimizer, batch, cfg.optim.micro_batch, cfg.optim.clip_low,
                                      cfg.optim.clip_high, grad_clip=0.0)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            out[name] = {"stats": stats, "first_s": times[0], "wall_s": sorted(times[1:])[len(times[1:]) // 2],
                         "forward_tokens": stats["loss/forward_tokens"]}
        except Exception as exc:  # e.g. flex attention has no CPU backward: reported, not a failure
            out[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        del model
    return out


def run(args: argparse.Namespace) -> int:
    import torch

    from trace_gym.training.driver.trainer import Trainer

    started = time.perf_counter()
    if args.backend == "vllm":
        try:
            import vllm
        except ImportError as exc:
            check("vllm installed", False, f"{exc}; fix: pip install -e '.[vllm]' from the checkout")
            return 1
        check("vllm installed", True, f"vllm {vllm.__version__}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        check("cuda available", False, "torch.cuda.is_available() is False; fix: a CUDA build of torch and a GPU")
        return 1
    cfg = build_config(args)
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    setup_s = time.perf_counter() - t0
    engine = find_engine(trainer.policy)
    if args.backend == "vllm":
        check("engine metrics", prefix_counters(engine) is not None,
              "vLLM prefix-cache counters readable" if prefix_counters(engine) is not None else
              "no vllm:prefix_cache_* counters; fix: build the LLM with disable_log_stats=False")
    meter = StageMeter(trainer.collector, engine)
    tol = args.tolerance
    rows = []
    prompts: list[list[int]] = []
    updates: dict[str, Any] = {}
    try:
        for _ in range(2):
            before = param_vector(trainer.model)
            metrics = trainer.step()
            delta = float((param_vector(trainer.model) - before).norm())
            step = trainer.step_count
            check(f"step {step} budget", metrics["rollout/trajectories"] == cfg.alloc.roots * 2,
                  f"{metrics['rollout/trajectories']:.0f} trajectories for a budget of {cfg.alloc.roots * 2}")
            trained = metrics.get("loss/tokens", 0.0) > 0 and delta > 0
            detail = f"{metrics.get('loss/tokens', 0.0):.0f} tokens, |Δθ| = {delta:.3g}"
            if args.sft_steps > 0:  # without a warm start every tree may be all-fail: no gradient, no failure
                check(f"step {step} trained", trained, detail)
            else:
                print(f"[info] step {step} trained: {detail}")
            if not prompts:
                prompts = [t.root.prompt_ids for t in list(trainer.collector.trees.values())[:4]]
            _, gap = probe(trainer, prompts)
            check(f"step {step} sync", gap <= tol, f"max |engine - trainer| log-prob gap {gap:.2e} (tol {tol})")
            kept = {k: v for k, v in metrics.items() if k.startswith(("time/", "rollout/", "loss/", "alloc/"))}
            rows.append({"step": step, "param_delta": delta, "logprob_gap": gap, **kept})
        # A known weight change: the engine must follow it after a sync. The change is large enough to show
        # (the model's own log-probs move by far more than the tolerance), so a stale engine fails the gap check.
        tokens_before, _ = probe(trainer, prompts)
        old = model_logprobs(trainer, prompts, tokens_before)
        generator = torch.Generator().manual_seed(args.seed)
        with torch.no_grad():
            for p in trainer.model.parameters():
                p.add_(args.perturb * torch.randn(p.shape, generator=generator).to(p.device, p.dtype))
        shift = float((model_logprobs(trainer, prompts, tokens_before) - old).abs().max())
        check("weight change is visible", shift > 10 * tol, f"trainer log-probs moved by {shift:.3g}")
        t0 = time.perf_counter()
        trainer.sync_weights()
        sync_s = time.perf_counter() - t0
        tokens_after, gap = probe(trainer, prompts)
        check("generation follows the synced weights", gap <= tol,
              f"engine vs changed model gap {gap:.2e} (tol {tol}); greedy tokens changed: "
              f"{tokens_after != tokens_before}; sync {sync_s:.2f} s")
        updates = update_paths(trainer, list(trainer.collector.trees.values()))
        report_updates(updates)
    finally:
        trainer.close()

    print("\nstep | " + " | ".join(["rollout_s", "expand_s", "predictor_s", "update_s", "sync_s", "step_s",
                                    "bare hit", "branch hit"]))
    for i, row in enumerate(rows):
        bare = meter.rates["bare"][i] if i < len(meter.rates["bare"]) else float("nan")
        branch = meter.rates["branches"][i] if i < len(meter.rates["branches"]) else float("nan")
        row.update({"prefix_hit_bare": bare, "prefix_hit_branches": branch})
        times = [row.get(f"time/{k}_s", float("nan")) for k in ("rollout", "expand", "predictor", "update", "sync",
                                                                 "step")]
        print(f"{row['step']:>4} | " + " | ".join(f"{t:9.2f}" for t in times) + f" | {bare:8.3f} | {branch:10.3f}")
    if args.backend == "vllm":
        rates = [r for r in meter.rates["branches"] if not math.isnan(r)]
        check("prefix cache on branches", bool(rates) and max(rates) > 0,
              f"hit rates {[round(r, 3) for r in meter.rates['branches']]}")
    failed = [name for name, ok, _ in CHECKS if not ok]
    total_s = time.perf_counter() - started
    summary = {"backend": args.backend, "device": args.device, "setup_s": setup_s, "total_s": total_s,
               "steps": rows, "update_paths": updates,
               "checks": [{"name": n, "ok": ok, "detail": d} for n, ok, d in CHECKS], "failed": failed}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_check.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    print(f"\nsetup {setup_s:.1f} s, total {total_s:.1f} s; {len(CHECKS) - len(failed)}/{len(CHECKS)} checks "
          f"passed; report in {Path(args.out) / 'gpu_check.json'}")
    return 1 if failed else 0


def report_updates(updates: dict[str, Any]) -> None:
    """Check 4 and the update paths' table."""
    rows, packed = updates["rows"], updates["packed_sdpa"]
    if "error" in rows or "error" in packed:
        check("packed update equals rows", False, f"rows: {rows.get('error')}, packed: {packed.get('error')}")
        return
    gaps = {k: abs(packed["stats"][k] - rows["stats"][k]) / max(abs(rows["stats"][k]), 1e-6)
            for k in ("loss/total", "loss/tokens", "loss/clip_frac", "loss/grad_norm")}
    check("packed update equals rows", max(gaps.values()) < 1e-3,
          f"largest relative gap {max(gaps.values()):.1e} over {sorted(gaps)} ({updates['nodes']} nodes)")
    print(f"\nupdate on the last step's trees: {updates['nodes']} nodes, {updates['row_tokens']} row tokens")
    print("path        | fwd tokens | first s | wall s | speed-up")
    for name in ("rows", "packed_sdpa", "packed_flex"):
        r = updates[name]
        if "error" in r:
            print(f"{name:<11} | {r['error']}")
            continue
        print(f"{name:<11} | {r['forward_tokens']:10.0f} | {r['first_s']:7.2f} | {r['wall_s']:6.3f} | "
              f"{rows['wall_s'] / r['wall_s']:7.2f}x")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["vllm", "hf"], default="vllm", help="generation backend (hf: dry run)")
    p.add_argument("--device", default="cuda", help="trainer device: cuda, cuda:1, cpu")
    p.add_argument("--out", default="runs/gpu_check", help="work folder (models, run, gpu_check.json)")
    p.add_argument("--roots", type=int, default=32, help="bare rollouts per step (budget = 2x this)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per turn in rollouts")
    p.add_argument("--sft-steps", type=int, default=500, help="warm-start SFT steps (0: none)")
    p.add_argument("--sft-episodes", type=int, default=2000, help="expert episodes for the warm start")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="vLLM's share of the GPU")
    p.add_argument("--tolerance", type=float, default=5e-2, help="largest allowed engine/trainer log-prob gap")
    p.add_argument("--perturb", type=float, default=0.05, help="std of the weight change in the sync check")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":  # the guard matters: vLLM's engine core starts processes with spawn
    sys.exit(run(parse_args()))
