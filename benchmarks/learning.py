"""Learning at equal budget: held-out gain against trajectories and generated tokens, tiny model on Arithmetic.

Every run starts from the same warm start and trains with the quickstart's update (AdamW 2e-5, mini-batch 32)
and budget (256 trajectories per step: 128 roots x (1 + 1)); runs differ only in the allocator (grpo, pcl,
treepo, trace, trace_adaptive) and the seed. A second table keeps trace and the total and changes the budget
shape, roots M x continuations N (the paper's Table 2, small).

The pool mixes difficulty tiers as real math sets mix GSM8K- and AIME-level problems (``TIERS``): one the warm
start solves only sometimes (it learned to guess there: the expert answered half of those episodes without the
tool), one it almost always solves with the tool, and one it never solves (five operators on 3-digit
numbers, outside its SFT). Most of grpo's groups are then all-success or all-failure, the regime TRACE is
for. ``--tasks`` training prompts come back every few steps as in epoch-based RL. Held-out: ``--eval-tasks``
prompts of another task seed from the same tiers, before and after training (and every ``--eval-every``
steps): sampled success (T = 1, ``--eval-samples`` episodes per prompt, fresh seeds), tool use, and the
teacher-forced probability of the expert's trajectory. Gains are paired per prompt within a run
(`Trainer.held_out_gain`) and their mean and 95% interval are then taken over seeds. Beside them: mixed
prompts per step, contrastive pairs per 1k generated tokens, the effective ratio (share of a step's trees with
both outcomes).

Writes benchmarks/results/learning[_quick].json and .png (the full run also docs/img/learning.png); prints
the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import (
    BENCH_RUNS,
    DOCS_IMG,
    RESULTS,
    ci_bars,
    fmt,
    machine,
    mean_ci,
    pyplot,
    train_config,
    warm_model,
    write_json,
)

ENV = "trace/Arithmetic-v0"
# The training and held-out pool: shares and generator settings per tier (ArithmeticEnv(tiers=...)).
TIERS = {"guess": {"share": 0.3, "min_ops": 1, "max_ops": 1, "min_digits": 1, "max_digits": 2},
         "tool": {"share": 0.35, "min_ops": 2, "max_ops": 2, "min_digits": 1, "max_digits": 1},
         "hard": {"share": 0.35, "min_ops": 5, "max_ops": 5, "min_digits": 3, "max_digits": 3}}
# The warm start's SFT: the two tiers it can learn, an expert that guesses on half of the "guess" episodes.
SFT_TIERS = {k: {**TIERS[k], "share": 0.5} for k in ("guess", "tool")}
EXPERT = {"guess": 0.5, "guess_tiers": ["guess"]}
# Arithmetic chains (trace/ArithmeticChain-v0): one calc call per statement, each carrying the last result.
# guess: two statements, where the warm start's expert answered after the first call in half of its episodes
# (a decision taken at depth 1); tool: three statements, which it finishes; hard: five statements on 2-digit
# operands with values up to 99,999, outside its SFT (never solved: the all-failure groups of the regime).
CHAIN_TIERS = {"guess": {"share": 0.3, "min_steps": 2, "max_steps": 2},
               "tool": {"share": 0.35, "min_steps": 3, "max_steps": 3},
               "hard": {"share": 0.35, "min_steps": 5, "max_steps": 5, "min_digits": 2, "max_digits": 2,
                        "max_value": 99_999}}
CHAIN_SFT_TIERS = {k: {**CHAIN_TIERS[k], "share": 0.5} for k in ("guess", "tool")}
# Per task: the runs/bench folder of its warm start, the env, its training tiers, other env settings, and the
# warm start's overrides (SFT episodes from the learnable tiers, the expert's habit).
TASKS: dict[str, dict[str, Any]] = {
    "tiers": {"name": "arithmetic-tiers", "env": ENV, "tiers": TIERS, "env_kwargs": {"word_fraction": 0.0},
              "overrides": [], "warm_overrides": [
                  "env.kwargs=" + json.dumps({"n_tasks": 2000, "task_seed": 0, "word_fraction": 0.0,
                                              "tiers": SFT_TIERS}),
                  f"sft.expert={json.dumps(EXPERT)}"]},
    "chain": {"name": "chain-tiers", "env": "trace/ArithmeticChain-v0", "tiers": CHAIN_TIERS, "env_kwargs": {},
              "overrides": [], "warm_overrides": [
                  f"env.kwargs={json.dumps({'n_tasks': 2000, 'task_seed': 0, 'tiers': CHAIN_SFT_TIERS})}",
                  f"sft.expert={json.dumps(EXPERT)}"]},
}
ALLOCATORS = ("grpo", "pcl", "treepo", "trace", "trace_adaptive")
BUDGET = (128, 1)  # roots M x continuations N: 256 trajectories per step, the quickstart's budget


def train_run(job: dict[str, Any]) -> dict[str, Any]:
    """One training run from the shared warm start; returns its summary and per-step metrics."""
    import torch

    from trace_gym.training.driver.metrics_log import read_metrics
    from trace_gym.training.driver.trainer import Trainer

    torch.set_num_threads(job["threads"])
    run_dir = BENCH_RUNS / "arithmetic" / "learn" / job["tag"] / f"{job['allocator']}-{job['seed']}"
    kwargs = {"n_tasks": job["tasks"], "task_seed": 0, "word_fraction": 0.0, "tiers": TIERS}
    overrides = [f"model.path={job['model']}", "sft.enabled=false", f"seed={job['seed']}",
                 f"env.kwargs={json.dumps(kwargs)}", f"env.eval_kwargs.n_tasks={job['eval_tasks']}",
                 f"alloc.allocator={job['allocator']}", f"alloc.roots={job['roots']}",
                 f"alloc.multiplier={job['multiplier']}", f"alloc.pool_size={job['pool']}", f"steps={job['steps']}",
                 f"eval.every={job['eval_every']}", f"eval.tasks={job['eval_tasks']}",
                 f"eval.samples={job['eval_samples']}", "eval.expert=true", "checkpoint.every=0",
                 "checkpoint.keep=1", "log.plots=false", "log.save_trees=none", "env.workers=1"]
    trainer = Trainer(train_config(ENV, run_dir, overrides))
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    return {**job, "summary": summary, "rows": read_metrics(run_dir)}


def curve(run: dict[str, Any]) -> list[dict[str, float]]:
    """Per evaluation: trajectories and generated tokens spent so far, held-out success and expert probability."""
    out, trajectories, tokens = [], 0.0, 0.0
    for row in run["rows"]:
        trajectories += row.get("rollout/trajectories", 0.0)
        tokens += row.get("rollout/tokens", 0.0)
        if "eval/success" in row:
            first = out[0] if out else {"success": row["eval/success"], "expert": row["eval/expert_prob"]}
            out.append({"trajectories": trajectories, "tokens": tokens, "success": row["eval/success"],
                        "expert": row["eval/expert_prob"], "tool_use": row.get("eval/tool_use", float("nan")),
                        "success_gain": row["eval/success"] - first["success"],
                        "expert_gain": row["eval/expert_prob"] - first["expert"]})
    return out


def versus(runs: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Gain minus the baseline's gain, seed by seed (same seed: same prompts, same held-out draws), then mean
    and 95% interval over seeds."""
    base = {r["seed"]: r["summary"]["gain"] for r in baseline}
    return {k: mean_ci([r["summary"]["gain"][k]["mean"] - base[r["seed"]][k]["mean"] for r in runs
                        if r["seed"] in base]) for k in ("success", "expert")}


def mixed_per_step(run: dict[str, Any]) -> float:
    """Mean over a run's steps of its mixed prompts (effective ratio x prompts rolled out)."""
    rows = [row for row in run["rows"] if "alloc/effective_ratio" in row]
    return float(np.nanmean([row["alloc/effective_ratio"] * row["rollout/prompts"] for row in rows]))


def mixed_ratio(runs: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[str, float]:
    """Mixed prompts per step over the baseline's, seed by seed, then mean and 95% interval over seeds."""
    base = {r["seed"]: mixed_per_step(r) for r in baseline}
    return mean_ci([mixed_per_step(r) / base[r["seed"]] for r in runs if r["seed"] in base and base[r["seed"]] > 0])


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per group, mean and 95% interval over seeds: paired gains, step statistics, cost, the eval curve."""
    s = [r["summary"] for r in runs]
    steps = [[row for row in r["rows"] if "alloc/effective_ratio" in row] for r in runs]

    def per_step(key: str) -> dict[str, float]:
        return mean_ci([float(np.nanmean([row.get(key, np.nan) for row in rows])) for rows in steps])

    curves = [curve(r) for r in runs]
    points = [{k: mean_ci([c[i][k] for c in curves]) for k in curves[0][i]} for i in range(min(map(len, curves)))]
    return {"success_before": mean_ci([x["success_before"] for x in s]),
            "success_after": mean_ci([x["success_after"] for x in s]),
            "gain_success": mean_ci([x["gain"]["success"]["mean"] for x in s]),
            "gain_expert": mean_ci([x["gain"]["expert"]["mean"] for x in s]),
            "tool_use_before": mean_ci([x.get("tool_use_before", float("nan")) for x in s]),
            "tool_use_after": mean_ci([x.get("tool_use_after", float("nan")) for x in s]),
            "gain_per_seed": [{k: x["gain"][k] for k in ("success", "expert")} for x in s],
            "effective_ratio": per_step("alloc/effective_ratio"),
            "effective_ratio_first": mean_ci([rows[0]["alloc/effective_ratio"] for rows in steps if rows]),
            "mixed_per_step": mean_ci([mixed_per_step(r) for r in runs]),
            "pairs_per_1k_tokens": per_step("alloc/pairs_per_1k_tokens"),
            "trajectories": mean_ci([x["trajectories"] for x in s]),
            "generated_tokens": mean_ci([x["generated_tokens"] for x in s]),
            "wall_s": mean_ci([x["wall_s"] for x in s]), "curve": points, "seeds": len(runs)}


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for name, g in result["allocators"].items():
        for ax, x_key, y_key in ((axes[0], "trajectories", "success_gain"), (axes[1], "tokens", "success_gain")):
            x = np.array([p[x_key]["mean"] for p in g["curve"]])
            m = np.array([p[y_key]["mean"] for p in g["curve"]])
            ci = np.nan_to_num(np.array([p[y_key]["ci95"] for p in g["curve"]], float))
            ax.plot(x, m, marker="o", label=name)
            ax.fill_between(x, m - ci, m + ci, alpha=0.12)
    st = result["settings"]
    axes[0].set_xlabel("trajectories spent")
    axes[1].set_xlabel("generated tokens")
    for ax in axes[:2]:
        ax.set_ylabel(f"held-out gain, success (T=1, {st['eval_samples']} samples/prompt)")
        ax.set_title(f"Arithmetic tiers {'/'.join(TIERS)}, tiny model, {st['seeds']} seeds (95% CI)", fontsize=9)
        ax.legend(fontsize=8)
    shapes = {f"{k}\nratio {g['effective_ratio']['mean']:.2f}": g for k, g in result["shapes"].items()}
    if shapes:
        ci_bars(axes[2], shapes, (("gain_success", "tab:green"),))
        axes[2].relim()
        axes[2].autoscale(axis="y")  # ci_bars' 0-1 range suits ratios, not gains
    axes[2].set_ylabel("held-out gain, success")
    axes[2].set_title("trace, budget shape M roots x N continuations (equal total)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_tables(by_alloc: dict[str, Any], by_shape: dict[str, Any]) -> None:
    cols = ("success_before", "gain_success", "success_vs_grpo", "tool_use_before", "tool_use_after",
            "effective_ratio", "mixed_per_step", "mixed_vs_grpo", "pairs_per_1k_tokens", "generated_tokens")
    for title, rows in (("allocators (256 trajectories per step)", by_alloc), ("trace budget shapes", by_shape)):
        print(f"\n{title}")
        print(f"{'':16s}" + "".join(f"{c:>20s}" for c in cols))
        for name, g in rows.items():
            print(f"{name:16s}" + "".join(f"{fmt(g[c], 0 if c == 'generated_tokens' else 3) if c in g else '-':>20s}"
                                          for c in cols))


def print_targets(by_alloc: dict[str, Any]) -> None:
    """The comparison the benchmark exists for, against grpo at equal trajectories."""
    if "grpo" not in by_alloc:
        return
    grpo = by_alloc["grpo"]
    print(f"\ngrpo's effective ratio at the warm start: {grpo['effective_ratio_first']['mean']:.3f} (regime: < 0.4)")
    for name in ("trace", "trace_adaptive"):
        if name in by_alloc:
            g = by_alloc[name]
            print(f"{name}: mixed prompts per step {g['mixed_vs_grpo']['mean']:.2f}x grpo's (target >= 1.5); "
                  f"sampled gain minus grpo's {fmt(g['success_vs_grpo'], 3)} (target >= 0)")


def tabulate(runs: list[dict[str, Any]], allocators: Sequence[str], shapes: Sequence[tuple[int, int]]
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per allocator and per trace budget shape: `aggregate`, plus the gain against grpo's seed by seed."""
    by_alloc = {a: aggregate([r for r in runs if r["tag"] == "alloc" and r["allocator"] == a]) for a in allocators}
    grpo = [r for r in runs if r["tag"] == "alloc" and r["allocator"] == "grpo"]
    for a in allocators:
        if grpo and a != "grpo":
            vs = versus([r for r in runs if r["tag"] == "alloc" and r["allocator"] == a], grpo)
            by_alloc[a].update({"success_vs_grpo": vs["success"], "expert_vs_grpo": vs["expert"],
                                "mixed_vs_grpo": mixed_ratio([r for r in runs if r["tag"] == "alloc"
                                                              and r["allocator"] == a], grpo)})
    by_shape = {f"{m}x{n}": aggregate([r for r in runs if r["allocator"] == "trace" and r["roots"] == m
                                       and r["multiplier"] == n]) for m, n in shapes} if "trace" in allocators else {}
    return by_alloc, by_shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="grpo vs trace, 1 seed, 2 steps, one other shape, 32 held-out prompts (CI)")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--allocators", nargs="*", default=None, choices=ALLOCATORS)
    parser.add_argument("--tasks", type=int, default=256, help="training prompts (revisited every few steps)")
    parser.add_argument("--eval-tasks", type=int, default=None)
    parser.add_argument("--eval-samples", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=0, help="0: before and after only")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--replot", action="store_true",
                        help="no training: tables and plot again from the last results JSON and its run folders")
    args = parser.parse_args()
    quick = args.quick
    name = "learning_quick" if quick else "learning"
    if args.replot:
        report(json.loads((RESULTS / f"{name}.json").read_text()), name, quick)
        return
    seeds = args.seeds or (1 if quick else 3)
    steps = args.steps or (2 if quick else 12)
    eval_tasks = args.eval_tasks or (32 if quick else 200)
    allocators = tuple(args.allocators or (("grpo", "trace") if quick else ALLOCATORS))
    shapes = (BUDGET, (64, 3)) if quick else (BUDGET, (64, 3), (32, 7))  # equal total: 256 trajectories/step
    start = time.perf_counter()
    model = warm_model(ENV, TASKS["tiers"]["name"], TASKS["tiers"]["warm_overrides"])
    base = {"model": model, "steps": steps, "eval_every": args.eval_every, "eval_tasks": eval_tasks,
            "eval_samples": args.eval_samples, "pool": 64, "tasks": args.tasks,
            "threads": max(1, 2 // args.workers)}
    jobs = [{**base, "tag": "alloc", "allocator": a, "seed": s, "roots": BUDGET[0], "multiplier": BUDGET[1]}
            for a in allocators for s in range(seeds)]
    jobs += [{**base, "tag": f"shape{m}x{n}", "allocator": "trace", "seed": s, "roots": m, "multiplier": n}
             for m, n in shapes if (m, n) != BUDGET for s in range(seeds)]
    os.environ.setdefault("OMP_NUM_THREADS", str(base["threads"]))
    with ProcessPoolExecutor(args.workers) as ex:
        futures = [ex.submit(train_run, job) for job in jobs]
        for k, future in enumerate(as_completed(futures), 1):
            if future.exception() is not None:  # fail fast: the other runs' figures would not make a table
                for other in futures:
                    other.cancel()
                raise future.exception()  # type: ignore[misc]
            r = future.result()
            gain = r["summary"]["gain"]
            print(f"[{k}/{len(jobs)}] {r['tag']} {r['allocator']} seed {r['seed']}: "
                  f"success {gain['success']['mean']:+.3f}, expert {gain['expert']['mean']:+.3f} "
                  f"({r['summary']['wall_s']:.0f} s)", flush=True)
        runs = [f.result() for f in futures]
    settings = {"env": ENV, "tiers": TIERS, "sft_tiers": SFT_TIERS, "expert": EXPERT, "tasks": args.tasks,
                "seeds": seeds, "steps": steps,
                "trajectories_per_step": BUDGET[0] * (1 + BUDGET[1]), "pool": 64, "eval_tasks": eval_tasks,
                "eval_samples": args.eval_samples, "model": model, "allocators": allocators, "shapes": shapes}
    result = {"settings": settings, "runs": [{k: v for k, v in r.items() if k != "model"} for r in runs]}
    report({"machine": machine(), "seconds": time.perf_counter() - start, "learning": result}, name, quick)


def report(payload: dict[str, Any], name: str, quick: bool) -> None:
    """Tables, JSON and plot from the runs in ``payload`` (rows re-read from the run folders when absent)."""
    from trace_gym.training.driver.metrics_log import read_metrics

    result = payload["learning"]
    st = result["settings"]
    runs = [{**r, "rows": r.get("rows") or read_metrics(r["summary"]["run_dir"])} for r in result["runs"]]
    shapes = [tuple(x) for x in st.get("shapes", (BUDGET, (64, 3), (32, 7)))]
    allocators = st.get("allocators") or list(dict.fromkeys(r["allocator"] for r in runs if r["tag"] == "alloc"))
    result["allocators"], result["shapes"] = tabulate(runs, allocators, shapes)
    result["runs"] = runs
    print_tables(result["allocators"], result["shapes"])
    print_targets(result["allocators"])
    path = write_json(name, payload)
    png = RESULTS / f"{name}.png"
    plot(result, png)
    print(f"\nwrote {path} and {png}; the runs took {payload['seconds']:.0f} s")
    if not quick:
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        (DOCS_IMG / "learning.png").write_bytes(png.read_bytes())


if __name__ == "__main__":
    main()
