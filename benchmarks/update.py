"""The policy update, tree-packed against one padded row per node, side by side on the same trees and model.

Trees: each env's scripted expert (noise 0.3) plays through the token-recording `TreeCollector`, its turns
tokenised by the tiny model's tokenizer and scored by the tiny model (the behaviour log-probs), so the trees
have the token shapes a warm-started tiny policy produces without minutes of SFT first:
1. quickstart: trace/Arithmetic-v0 with configs/quickstart.yaml's env, 8 prompts x 4 bare rollouts, then 32
   continuations from the open prefixes (its budget of 32 roots + 32 continuations; two turns each);
2. hotpotqa: trace/HotpotQA-v0, multi-turn search (two hops, distractor searches from the noise), 2 passages
   of up to 400 characters per search, 4 prompts x 4 bare rollouts + 16 continuations.
Advantages are the trees' own (tree_grpo), zero-advantage nodes left out, as the trainer does.

For each tree set: the trees' tokens (each tree node's tokens once, on the paths to trained nodes) and the
trie's (distinct prefixes: what a packed update must compute), then for rows and packed updates of the real
`Learner` (tiny model, quickstart's optimiser settings): tokens run through the model per step, their ratio to
the trie's, and the wall time per update (median of repeats). Packed with an additive (eager) mask and with
flex attention are tried too; PyTorch's flex attention has no backward on the CPU. On hotpotqa, a sweep of
``optim.pack_tokens``.

Usage: python benchmarks/update.py [--quick] [--threads N]   (writes benchmarks/results/update[_quick].json)
"""

from __future__ import annotations

import argparse
import functools
import re
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine, write_json

import trace_gym  # noqa: F401 - registers the trace/* ids
from trace_gym.agents.chat import encode
from trace_gym.agents.hf import sequence_logprobs
from trace_gym.agents.policy import Generation, Request, SamplingParams
from trace_gym.env_specs import env_factory
from trace_gym.training.config import TrainConfig
from trace_gym.training.rollout.collector import TreeCollector
from trace_gym.training.step import build_samples
from trace_gym.training.update.learner import Learner
from trace_gym.training.update.packing import unique_tokens
from trace_gym.training.update.samples import Sample
from trace_gym.tree import RolloutTree

SETS: dict[str, dict[str, Any]] = {
    "quickstart": {"env": "trace/Arithmetic-v0", "kwargs": {"n_tasks": 2000, "task_seed": 0, "word_fraction": 0.0},
                   "prompts": 8, "roots": 4, "continuations": 32},
    "hotpotqa": {"env": "trace/HotpotQA-v0", "kwargs": {"action_format": "tags", "top_k": 2,
                                                          "max_passage_chars": 400},
                 "prompts": 4, "roots": 4, "continuations": 16},
}
OPTIM = {"lr": 2e-5, "mini_batch": 32, "micro_batch": 16}  # configs/quickstart.yaml


class ScoredExpert:
    """A `Policy` for token-recording collection: the env's scripted expert reads the chat back from the
    prompt ids (the tiny tokenizer is lossless), its text is encoded plus end-of-turn, and the model scores it."""

    def __init__(self, make_expert: Callable[[int], Any], tokenizer: Any, model: torch.nn.Module):
        self.make_expert, self.tokenizer, self.model = make_expert, tokenizer, model

    @torch.no_grad()
    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Generation]:
        out = []
        for i, req in enumerate(requests):
            prompt = list(req.prompt_ids or [])
            messages = chat_messages(self.tokenizer.decode(prompt, skip_special_tokens=False))
            text = self.make_expert(req.seed or 0).act(req.task, messages)
            ids = [*encode(self.tokenizer, text), self.tokenizer.eos_token_id]
            logprobs = sequence_logprobs(self.model, torch.tensor([prompt + ids]))[0, -len(ids):]
            out.append(Generation(text=text, token_ids=ids, logprobs=logprobs.tolist(), finish_reason="stop",
                                  prompt_tokens=len(prompt), request_index=i))
        return out


_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def chat_messages(text: str) -> list[dict[str, str]]:
    """The chat messages of a rendered prompt (agents/tiny.py's template): system, user, assistant turns, and
    user turns of <tool_response> blocks as tool messages."""
    out = []
    for chunk in text.split("<|im_start|>")[1:]:
        role, _, body = chunk.partition("\n")
        body = body.removesuffix("\n").removesuffix("<|im_end|>")
        if not body and role == "assistant":
            continue  # the generation prompt
        responses = _TOOL_RESPONSE.findall(body) if role == "user" else []
        if responses:
            out.extend({"role": "tool", "content": r} for r in responses)
        else:
            out.append({"role": role, "content": body})
    return out


def collect(spec: dict[str, Any], model: torch.nn.Module, tokenizer: Any, seed: int = 0) -> list[RolloutTree]:
    make_env = env_factory(spec["env"], spec["kwargs"])
    tasks = make_env.tasks()[:spec["prompts"]]
    policy = ScoredExpert(lambda s: make_env.expert(noise=0.3, seed=s), tokenizer, model)
    collector = TreeCollector(policy, make_env, tasks, SamplingParams(max_new_tokens=256), tokenizer=tokenizer,
                              workers=2, max_context=16384)
    try:
        collector.bare_rollouts({t.id: spec["roots"] for t in tasks}, seed=seed)
        opens = [(tid, n.id) for tid, tree in collector.trees.items() for n in tree.nodes
                 if n.depth >= 1 and not n.is_terminal]
        plan: dict[tuple[str, int], int] = {}
        for j in range(spec["continuations"]):  # round-robin over the open prefixes
            key = opens[j % len(opens)]
            plan[key] = plan.get(key, 0) + 1
        collector.continuations(plan, seed=seed + 1)
        return list(collector.trees.values())
    finally:
        collector.close()
        make_env.close()


def tree_tokens(trees: Sequence[RolloutTree]) -> int:
    """Each tree node's tokens once, over the paths to the trained nodes: prompt, actions, and the observations
    that a trained node's context contains."""
    total = 0
    for tree in trees:
        trained = [n.id for n in tree.nodes if n.token_ids and n.logprobs and abs(n.meta.get("advantage", 0)) > 1e-8]
        on_path: set[int] = set()
        inner: set[int] = set()  # nodes whose observation some trained context holds
        for nid in trained:
            path = [n.id for n in tree.path(nid)]
            on_path.update(path)
            inner.update(path[:-1])
        if not on_path:
            continue
        total += len(tree.root.prompt_ids or [])
        total += sum(len(tree[n].token_ids or []) for n in on_path if n != 0)
        total += sum(len(tree[n].obs_ids or []) for n in inner if n != 0)
    return total


def learner(model_dir: Path, update: str, **optim: Any) -> Learner:
    cfg = TrainConfig.from_dict({"model": {"path": str(model_dir)}, "optim": {**OPTIM, "update": update, **optim}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Learner(cfg.model, cfg.optim, str(model_dir), torch.device("cpu"), seed=cfg.seed)


def timed(make: Callable[[], Learner], samples: list[Sample], repeats: int) -> dict[str, Any]:
    """Wall time of `Learner.update` (median over ``repeats`` after one warm-up) and its tokens."""
    lrn = make()
    stats = lrn.update(samples, seed=0, pad_id=0)
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        lrn.update(samples, seed=r + 1, pad_id=0)
        times.append(time.perf_counter() - t0)
    return {"wall_s": statistics.median(times), "forward_tokens": stats["loss/forward_tokens"],
            "optimizer_steps": stats["loss/optimizer_steps"], "packed": bool(stats["loss/packed"])}


def flex_attempt(model_dir: Path, samples: list[Sample]) -> str:
    """Whether a packed update runs with flex attention here (a message either way)."""
    from transformers import AutoModelForCausalLM

    from trace_gym.training.update.optimizer_step import policy_update
    from trace_gym.training.update.packing import pack_rows

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="flex_attention")
    try:
        policy_update(model, torch.optim.SGD(model.parameters(), lr=0.0), [pack_rows(samples[:4])])
        return "ran"
    except Exception as exc:  # report whatever stops it (no CPU backward, a compiler error)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def run_set(name: str, spec: dict[str, Any], model_dir: Path, repeats: int, sweep: Sequence[int]) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    t0 = time.perf_counter()
    trees = collect(spec, model, tokenizer)
    samples = build_samples({t.task_id: t for t in trees}, "tree_grpo").samples
    rows = [s.context + s.action for s in samples]
    out: dict[str, Any] = {
        "collect_s": time.perf_counter() - t0, "trees": len(trees), "nodes": len(samples),
        "max_depth": max(n.depth for t in trees for n in t.nodes),
        "success": sum(n.reward > 0 for t in trees for n in t.nodes if n.is_terminal) /
        max(1, sum(n.is_terminal for t in trees for n in t.nodes)),
        "row_tokens": sum(map(len, rows)), "tree_tokens": tree_tokens(trees), "trie_tokens": unique_tokens(rows),
        "longest_row": max(map(len, rows)),
    }
    everything = {"mini_batch": max(len(samples), 1), "micro_batch": max(len(samples), 1)}
    runs = {
        "rows": lambda: learner(model_dir, "rows"),
        "packed": lambda: learner(model_dir, "packed"),
        "rows_one_step": lambda: learner(model_dir, "rows", **{**everything, "micro_batch": OPTIM["micro_batch"]}),
        "packed_one_step": lambda: learner(model_dir, "packed", **everything),
        "packed_eager": functools.partial(_eager_learner, model_dir),
    }
    out["runs"] = {}
    for key, make in runs.items():
        out["runs"][key] = timed(make, samples, repeats)
        print(f"  {name} {key}: {out['runs'][key]}", flush=True)
    for key in sweep:
        out["runs"][f"packed_{key}"] = timed(lambda k=key: learner(model_dir, "packed", pack_tokens=k, **everything),
                                             samples, repeats)
        print(f"  {name} packed_{key}: {out['runs'][f'packed_{key}']}", flush=True)
    for run in out["runs"].values():
        run["tokens_vs_trie"] = run["forward_tokens"] / out["trie_tokens"]
    base = {"rows": "rows", "packed": "rows", "rows_one_step": "rows_one_step", "packed_one_step": "rows_one_step",
            "packed_eager": "rows"}
    for key, run in out["runs"].items():
        run["speedup"] = out["runs"][base.get(key, "rows_one_step")]["wall_s"] / run["wall_s"]
    out["flex_attention"] = flex_attempt(model_dir, samples)
    return out


def _eager_learner(model_dir: Path) -> Learner:
    """A packed learner whose model attends through transformers' eager path (the additive mask)."""
    from trace_gym.training.update.packing import attention_implementation

    lrn = learner(model_dir, "packed")
    lrn.model.set_attn_implementation("eager")
    assert attention_implementation(lrn.module) == "eager"
    return lrn


def table(results: dict[str, Any]) -> str:
    lines = []
    for name, r in results["sets"].items():
        lines.append(f"\n{name}: {r['trees']} trees, {r['nodes']} trained nodes, depth <= {r['max_depth']}, "
                     f"expert success {r['success']:.2f}; row tokens {r['row_tokens']}, tree tokens "
                     f"{r['tree_tokens']}, trie tokens {r['trie_tokens']} (rows/trie "
                     f"{r['row_tokens'] / r['trie_tokens']:.2f}x), longest row {r['longest_row']}")
        lines.append(f"  {'update':<18}{'opt steps':>10}{'fwd tokens':>12}{'vs trie':>9}{'wall s':>9}{'speed-up':>10}")
        for key, run in r["runs"].items():
            lines.append(f"  {key:<18}{run['optimizer_steps']:>10.0f}{run['forward_tokens']:>12.0f}"
                         f"{run['tokens_vs_trie']:>8.2f}x{run['wall_s']:>9.2f}{run['speedup']:>9.2f}x")
        lines.append(f"  flex attention: {r['flex_attention']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer prompts, one timed repeat, no budget sweep")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from trace_gym.agents.tiny import build_tiny_model

    sets = {k: dict(v) for k, v in SETS.items()}
    repeats, sweep = args.repeats, (1024, 2048, 4096, 8192)
    if args.quick:
        for spec in sets.values():
            spec.update(prompts=2, continuations=spec["continuations"] // 4)
        repeats, sweep = 1, ()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny", size="tiny", seed=0)
        results: dict[str, Any] = {"machine": {**machine(), "threads": torch.get_num_threads()}, "optim": OPTIM,
                                   "repeats": repeats, "sets": {}}
        for name, spec in sets.items():
            print(f"{name}: collecting and timing", flush=True)
            results["sets"][name] = {"spec": spec, **run_set(name, spec, model_dir, repeats,
                                                             sweep if name == "hotpotqa" else ())}
    print(table(results))
    path = write_json("update_quick" if args.quick else "update", results)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
