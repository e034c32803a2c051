"""Learning at equal budget and equal optimiser steps: can the benchmark tell allocators apart, and does TRACE win?

Every run starts from the same warm start and differs from the others of its seed only in its row of ``ROWS``:
the allocator (grpo, pcl, the paper's trace, the TRACE variants of training/allocation/allocators.py) and, for
the variants, the predictor settings (``CALIBRATED``). All spend the same trajectories per step (M roots x
(1 + N)) and take exactly ``--mini-batches`` optimiser steps per RL step whatever their number of trained
nodes (``optim.mini_batches``; `loss/optimizer_steps` is logged and checked), so neither the budget nor the
size of the update differs between rows. ``shuffled`` is the control: the variant's run with its advantages
permuted over the trained nodes before each update, what updates of that size do without the reward.

The task (``--task``, default ``chain``) is a pool of difficulty tiers of one env (``TASKS``). ``chain``
(trace/ArithmeticChain-v0: one calc call per statement, each carrying the last result) places the warm start's
habit after the first call: on the guess tier its expert answered after one call in half of its episodes, so the
outcome is still open at depth 1, where prefix expansion can find it (benchmarks/flips.py measures how often a
continuation flips its anchor's outcome at the fixed warm start). The hard tier is never solved: the all-failure
groups of the paper's regime. Training prompts (``--tasks``) come back every few steps as in epoch-based RL.

Held-out: ``--eval-tasks`` prompts of another task seed from the learnable tiers only, ``--eval-samples``
sampled episodes each (T = 1) before training (once per seed: every row of a seed starts from the same
weights and draws the same evaluation seeds) and at each step of ``--eval-at`` (the last, by default: 800
episodes cost minutes), with the teacher-forced probability of the expert's trajectory, which is also taken
alone every ``--expert-every`` steps (seconds). A row's gain is paired per prompt; rows are compared seed by
seed (same seed: same training prompts, same held-out draws) and the mean difference gets a 95% t-interval
over seeds. "Equal tokens" compares the rows at the generated-token count the most frugal row of each seed
reached, each run's gain interpolated linearly between its evaluations: a real curve for the expert
probability, a straight line from the start for sampled success when it is evaluated at the end only.

Writes benchmarks/results/learning[_quick].json (with the ``headline`` object) and .png (the full run also
docs/img/learning.png); prints the tables.
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
from _common import BENCH_RUNS, DOCS_IMG, RESULTS, fmt, machine, mean_ci, pyplot, train_config, warm_model, write_json

ENV = "trace/Arithmetic-v0"
# The Arithmetic tiers (the earlier version of this benchmark): the habit, to guess without the tool, is taken
# at turn 1. guess: one operator on 1-2 digits; tool: two on 1 digit; hard: five on 3 digits, never solved.
TIERS = {"guess": {"share": 0.3, "min_ops": 1, "max_ops": 1, "min_digits": 1, "max_digits": 2},
         "tool": {"share": 0.35, "min_ops": 2, "max_ops": 2, "min_digits": 1, "max_digits": 1},
         "hard": {"share": 0.35, "min_ops": 5, "max_ops": 5, "min_digits": 3, "max_digits": 3}}
SFT_TIERS = {k: {**TIERS[k], "share": 0.5} for k in ("guess", "tool")}
EXPERT = {"guess": 0.5, "guess_tiers": ["guess"]}
# Arithmetic chains (trace/ArithmeticChain-v0). guess: two statements, where the warm start's expert answered
# after the first call in half of its episodes (a decision taken at depth 1); tool: three statements, which it
# finishes; hard: five statements on 2-digit operands with values up to 99,999, outside its SFT.
CHAIN_TIERS = {"guess": {"share": 0.3, "min_steps": 2, "max_steps": 2},
               "tool": {"share": 0.35, "min_steps": 3, "max_steps": 3},
               "hard": {"share": 0.35, "min_steps": 5, "max_steps": 5, "min_digits": 2, "max_digits": 2,
                        "max_value": 99_999}}
CHAIN_SFT_TIERS = {k: {**CHAIN_TIERS[k], "share": 0.5} for k in ("guess", "tool")}
# Per task: the runs/bench folder of its warm start, the env, its training tiers, the learnable tiers (held
# out), other env settings, and the warm start's overrides (SFT on the learnable tiers, the expert's habit).
TASKS: dict[str, dict[str, Any]] = {
    "tiers": {"name": "arithmetic-tiers", "env": ENV, "tiers": TIERS, "learnable": ("guess", "tool"),
              "env_kwargs": {"word_fraction": 0.0}, "overrides": [], "warm_overrides": [
                  "env.kwargs=" + json.dumps({"n_tasks": 2000, "task_seed": 0, "word_fraction": 0.0,
                                              "tiers": SFT_TIERS}),
                  f"sft.expert={json.dumps(EXPERT)}"]},
    "chain": {"name": "chain-tiers", "env": "trace/ArithmeticChain-v0", "tiers": CHAIN_TIERS,
              "learnable": ("guess", "tool"), "env_kwargs": {}, "overrides": [], "warm_overrides": [
                  f"env.kwargs={json.dumps({'n_tasks': 2000, 'task_seed': 0, 'tiers': CHAIN_SFT_TIERS})}",
                  f"sft.expert={json.dumps(EXPERT)}"]},
}
# The CI's warm start: the same data, a few SFT steps (the quick run shows that the pipeline runs, not figures).
QUICK_WARM = ["sft.steps=40", "sft.episodes=400"]
# The variants' predictor: children targets, online recalibration, one epoch of replay (256 prompts over pools
# of 64). Chosen from the measured defects (docs/results.md), not tuned on these runs.
CALIBRATED = ["predictor.target=children", "predictor.calibrate=true", "predictor.replay=4"]
ROWS: dict[str, dict[str, Any]] = {
    "grpo": {"allocator": "grpo"},
    "pcl": {"allocator": "pcl"},
    "trace": {"allocator": "trace"},
    "trace_plus": {"allocator": "trace_plus", "overrides": CALIBRATED},
    "trace_root": {"allocator": "trace_root", "overrides": CALIBRATED},
    "trace_root_uniform": {"allocator": "trace_root_uniform", "overrides": CALIBRATED},
    "shuffled": {"allocator": "trace_plus", "overrides": [*CALIBRATED, "optim.shuffle_advantages=true"]},
}
DEFAULT_ROWS = ("grpo", "pcl", "trace", "trace_plus", "trace_root", "trace_root_uniform", "shuffled")
BEST = "trace_plus"  # the variant the headline reports, named before any run (all the changes together)
VARIANTS = ("trace", "trace_plus", "trace_root", "trace_root_uniform")
MEASURES = ("success", "expert")


# --------------------------------------------------------------------------------------------- runs
def job_config(job: dict[str, Any], run_dir: Path) -> Any:
    task = TASKS[job["task"]]
    kwargs = {"n_tasks": job["tasks"], "task_seed": 0, **task["env_kwargs"], **job.get("env_kwargs", {}),
              "tiers": task["tiers"]}
    held_out = {"n_tasks": job["eval_tasks"], "task_seed": 1,
                "tiers": {k: {**v, "share": 1.0} for k, v in task["tiers"].items() if k in task["learnable"]}}
    row = ROWS[job["row"]]
    return train_config(task["env"], run_dir, [
        f"model.path={job['model']}", "sft.enabled=false", f"seed={job['seed']}", f"env.kwargs={json.dumps(kwargs)}",
        f"env.eval_kwargs={json.dumps(held_out)}", f"alloc.allocator={row['allocator']}",
        f"alloc.roots={job['roots']}", f"alloc.multiplier={job['multiplier']}", f"alloc.pool_size={job['pool']}",
        f"steps={job['steps']}", "eval.every=0", f"eval.tasks={job['eval_tasks']}",
        f"eval.samples={job['eval_samples']}", "eval.expert=true", "checkpoint.every=0", "log.plots=false",
        "log.save_trees=none", "env.workers=1", "optim.lr=2e-5", "optim.mini_batch=32",
        f"optim.mini_batches={job['mini_batches']}", *task["overrides"], *row.get("overrides", []),
        *job.get("overrides", [])])


def train_run(job: dict[str, Any]) -> dict[str, Any]:
    """One run (``job['row']`` None: the seed's evaluation before training); returns its per-step metrics and
    the per-prompt values of each evaluation."""
    import torch

    from trace_gym.training.driver.trainer import Trainer
    from trace_gym.training.rollout.evaluate import expert_logprob, expert_sequences

    torch.set_num_threads(job["threads"])
    name = f"{job['row']}-{job['seed']}" if job["row"] else f"before-{job['seed']}"
    run_dir = Path(job.get("run_root") or BENCH_RUNS / TASKS[job["task"]]["name"] / "learn") / name
    start = time.perf_counter()
    trainer = Trainer(job_config({**job, "row": job["row"] or "grpo"}, run_dir))
    rows: list[dict[str, Any]] = []
    evals: dict[int, dict[str, list[float]]] = {}
    try:
        if job["row"] is None:
            trainer.evaluate()
            evals[0] = dict(trainer.history.eval_last or {})
        else:
            seqs = None
            for step in range(1, job["steps"] + 1):
                metrics = trainer.step()
                if step in job["eval_at"]:
                    metrics.update(trainer.evaluate())
                    evals[step] = dict(trainer.history.eval_last or {})
                elif job.get("expert_every") and step % job["expert_every"] == 0:  # the cheap measure alone
                    seqs = seqs or expert_sequences(trainer.make_eval_env, trainer.eval_tasks, trainer.tokenizer)
                    probs = np.exp(expert_logprob(trainer.learner.model, seqs, trainer.tokenizer.pad_token_id))
                    evals[step] = {"expert": probs.tolist()}
                    metrics["eval/expert_prob"] = float(probs.mean())
                trainer.logger.log(step, metrics)
                rows.append({"step": step, **{k: v for k, v in metrics.items() if not isinstance(v, list | dict)}})
    finally:
        trainer.close()
    return {**job, "rows": rows, "evals": evals, "wall_s": time.perf_counter() - start}


# --------------------------------------------------------------------------------------------- figures
def paired_t(values: Sequence[float]) -> dict[str, float]:
    """Mean and 95% t-interval over seeds as {mean, lo, hi, n}."""
    m = mean_ci(list(values))
    half = m["ci95"] if np.isfinite(m["ci95"]) else float("nan")
    return {"mean": m["mean"], "lo": m["mean"] - half, "hi": m["mean"] + half, "n": m["n"]}


def gain_curve(run: dict[str, Any], before: dict[str, list[float]], measure: str) -> list[dict[str, float]]:
    """(trajectories, tokens, mean paired gain) at the start and at each evaluation of ``run``."""
    out = [{"step": 0, "trajectories": 0.0, "tokens": 0.0, "gain": 0.0}]
    spent = np.cumsum([[r.get("rollout/trajectories", 0.0), r.get("rollout/tokens", 0.0)] for r in run["rows"]],
                      axis=0) if run["rows"] else np.zeros((0, 2))
    for step, per_prompt in sorted((int(k), v) for k, v in run["evals"].items()):
        if step == 0 or measure not in per_prompt:
            continue
        out.append({"step": step, "trajectories": float(spent[step - 1, 0]), "tokens": float(spent[step - 1, 1]),
                    "gain": float(np.mean(np.subtract(per_prompt[measure], before[measure])))})
    return out


def gain_at_tokens(curve: list[dict[str, float]], tokens: float) -> float:
    """The gain interpolated linearly in generated tokens between the curve's points (clamped at the ends)."""
    return float(np.interp(tokens, [p["tokens"] for p in curve], [p["gain"] for p in curve]))


def _num(value: Any) -> float:
    """A metric as a float; missing (None once a NaN has been through the results JSON) is NaN."""
    return float("nan") if value is None else float(value)


def per_step(run: dict[str, Any], key: str) -> list[float]:
    return [_num(r.get(key)) for r in run["rows"]]


def flip_totals(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Realised and expected flips of the depth >= 1 anchors (and root anchors) over all steps and seeds, and
    per step summed over seeds with the predictor's prefix ECE: is the predictor's 1 - q^k calibrated?"""
    def total(key: str) -> float:
        return float(np.nansum([v for r in runs for v in per_step(r, key)]))

    steps = max((len(r["rows"]) for r in runs), default=0)
    by_step = []
    for i in range(steps):
        rows = [r["rows"][i] for r in runs if i < len(r["rows"])]
        anchors = float(np.nansum([_num(x.get("alloc/prefix_anchors")) for x in rows]))
        flips = float(np.nansum([_num(x.get("alloc/prefix_flips")) for x in rows]))
        by_step.append({"step": i + 1, "anchors": anchors, "flips": flips,
                        "expected": float(np.nansum([_num(x.get("alloc/prefix_flips_expected")) for x in rows])),
                        "share": flips / anchors if anchors else float("nan"),
                        "prefix_ece": float(np.nanmean([_num(x.get("predictor/prefix_ece")) for x in rows]))})
    anchors, flips = total("alloc/prefix_anchors"), total("alloc/prefix_flips")
    roots = total("alloc/root_anchor_anchors")
    return {"anchors": anchors, "flips": flips, "expected": total("alloc/prefix_flips_expected"),
            "share": flips / anchors if anchors else float("nan"),
            "per_seed_share": mean_ci([sum(per_step(r, "alloc/prefix_flips")) /
                                       max(sum(per_step(r, "alloc/prefix_anchors")), 1.0) for r in runs]),
            "root_anchors": roots, "root_flips": total("alloc/root_anchor_flips"),
            "root_expected": total("alloc/root_anchor_flips_expected"),
            "refund": total("alloc/refund"), "by_step": by_step}


def tabulate(runs: list[dict[str, Any]], befores: dict[int, dict[str, list[float]]], rows: Sequence[str],
             mini_batches: int) -> dict[str, Any]:
    """Per row: gains over seeds, differences against pcl and grpo seed by seed (at equal trajectories and at
    equal generated tokens), step statistics, optimiser steps, flips."""
    by_row = {r: sorted((x for x in runs if x["row"] == r), key=lambda x: x["seed"]) for r in rows}
    curves = {r: {x["seed"]: {m: gain_curve(x, befores[x["seed"]], m) for m in MEASURES} for x in xs}
              for r, xs in by_row.items()}
    seeds = sorted(befores)
    # equal tokens: per seed, the tokens the most frugal row had generated at its last evaluation
    budget = {s: min(curves[r][s]["success"][-1]["tokens"] for r in rows if s in curves[r]) for s in seeds}
    out: dict[str, Any] = {}
    for r, xs in by_row.items():
        final = {m: [curves[r][x["seed"]][m][-1]["gain"] for x in xs] for m in MEASURES}
        steps = [v for x in xs for v in per_step(x, "loss/optimizer_steps")]
        g: dict[str, Any] = {
            "seeds": len(xs), "gain": {m: paired_t(final[m]) for m in MEASURES},
            "gain_at_tokens": {m: paired_t([gain_at_tokens(curves[r][x["seed"]][m], budget[x["seed"]])
                                            for x in xs]) for m in MEASURES},
            "success_before": mean_ci([float(np.mean(befores[x["seed"]]["success"])) for x in xs]),
            "effective_ratio": mean_ci([float(np.nanmean(per_step(x, "alloc/effective_ratio"))) for x in xs]),
            "mixed_per_step": mean_ci([float(np.nanmean(np.multiply(per_step(x, "alloc/effective_ratio"),
                                                                      per_step(x, "rollout/prompts")))) for x in xs]),
            "tokens": mean_ci([float(np.sum(per_step(x, "rollout/tokens"))) for x in xs]),
            "trajectories": mean_ci([float(np.sum(per_step(x, "rollout/trajectories"))) for x in xs]),
            "trained_nodes": mean_ci([float(np.mean(per_step(x, "loss/nodes"))) for x in xs]),
            "optimizer_steps": {"min": float(np.min(steps)) if steps else float("nan"),
                                "max": float(np.max(steps)) if steps else float("nan"),
                                "mean": float(np.mean(steps)) if steps else float("nan")},
            "prefix_ece": mean_ci([float(np.nanmean(per_step(x, "predictor/prefix_ece"))) for x in xs]),
            "wall_s": mean_ci([x["wall_s"] for x in xs]), "flips": flip_totals(xs),
            "curve": {m: [{k: mean_ci([curves[r][x["seed"]][m][i][k] for x in xs]) for k in
                           ("trajectories", "tokens", "gain")}
                          for i in range(min(len(curves[r][x["seed"]][m]) for x in xs))] if xs else []
                      for m in MEASURES}}
        for base in ("pcl", "grpo"):
            if base in by_row and base != r:
                g[f"vs_{base}"] = {m: paired_t([final[m][i] - curves[base][x["seed"]][m][-1]["gain"]
                                                for i, x in enumerate(xs) if x["seed"] in curves[base]])
                                   for m in MEASURES}
                g[f"vs_{base}_at_tokens"] = {m: paired_t([
                    gain_at_tokens(curves[r][x["seed"]][m], budget[x["seed"]]) -
                    gain_at_tokens(curves[base][x["seed"]][m], budget[x["seed"]])
                    for x in xs if x["seed"] in curves[base]]) for m in MEASURES}
        out[r] = g
    for a, b in (("trace_root", "trace_root_uniform"), (BEST, "shuffled")):
        if a in by_row and b in by_row:
            out[a][f"vs_{b}"] = {m: paired_t([curves[a][s][m][-1]["gain"] - curves[b][s][m][-1]["gain"]
                                              for s in seeds if s in curves[a] and s in curves[b]])
                                 for m in MEASURES}
    equal = mini_batches > 0 and all(g["optimizer_steps"]["min"] == g["optimizer_steps"]["max"] == mini_batches
                                     for g in out.values())
    return {"rows": out, "token_budget": budget, "equal_optimizer_steps": equal}


def headline(table: dict[str, Any], seeds: int) -> dict[str, Any]:
    """The figures the docs quote: the pre-registered variant's seed-paired held-out sampled gain minus pcl's
    and grpo's (95% t-interval over seeds), the paper's trace's too, and the realised prefix flip share."""
    rows = table["rows"]
    best = BEST if BEST in rows else ("trace" if "trace" in rows else None)
    out: dict[str, Any] = {"best_variant": best, "seeds": seeds,
                           "equal_optimizer_steps": table["equal_optimizer_steps"]}
    for name, key in ((best, ""), ("trace", "paper_")):
        if name in rows:
            for base in ("pcl", "grpo"):
                if f"vs_{base}" in rows[name]:
                    out[f"{key}trace_minus_{base}"] = {k: rows[name][f"vs_{base}"]["success"][k]
                                                      for k in ("mean", "lo", "hi")}
    if best in rows:
        out["prefix_flip_rate"] = rows[best]["flips"]["share"]
    if "trace" in rows:
        out["paper_prefix_flip_rate"] = rows["trace"]["flips"]["share"]
    return out


# --------------------------------------------------------------------------------------------- output
def interval(v: dict[str, float] | None) -> str:
    """'+0.012 [-0.004,+0.028]' for {mean, lo, hi}; '-' without one."""
    if not v or not np.isfinite(v.get("mean", float("nan"))):
        return "-"
    return f"{v['mean']:+.3f} [{v['lo']:+.3f},{v['hi']:+.3f}]"


def print_tables(table: dict[str, Any]) -> None:
    rows = table["rows"]
    cols = ("gain success", "gain expert", "vs pcl", "vs grpo", "vs pcl @tokens (exp)", "mixed/step", "tokens",
            "opt steps", "flip share")
    print(f"\n{'':20s}" + "".join(f"{c:>24s}" for c in cols))
    for name, g in rows.items():
        vals = [interval(g["gain"]["success"]), interval(g["gain"]["expert"]),
                interval(g.get("vs_pcl", {}).get("success")), interval(g.get("vs_grpo", {}).get("success")),
                interval(g.get("vs_pcl_at_tokens", {}).get("expert")), fmt(g["mixed_per_step"], 1),
                fmt(g["tokens"], 0),
                f"{g['optimizer_steps']['min']:.0f}-{g['optimizer_steps']['max']:.0f}",
                f"{g['flips']['share']:.3f}" if np.isfinite(g["flips"]["share"]) else "-"]
        print(f"{name:20s}" + "".join(f"{v:>24s}" for v in vals))
    print(f"\nequal optimiser steps: {table['equal_optimizer_steps']}")
    for name in VARIANTS:
        if name in rows:
            f = rows[name]["flips"]
            print(f"{name}: depth >= 1 anchors {f['anchors']:.0f}, flipped {f['flips']:.0f} (share {f['share']:.3f}),"
                  f" predicted {f['expected']:.0f}; root anchors {f['root_anchors']:.0f}, flipped "
                  f"{f['root_flips']:.0f}, predicted {f['root_expected']:.0f}; refunded {f['refund']:.0f}")


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    rows = result["table"]["rows"]
    st = result["settings"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.4))
    for name, g in rows.items():
        for ax, key, measure in ((axes[0], "trajectories", "success"), (axes[1], "tokens", "expert")):
            curve = g["curve"][measure]
            x = np.array([p[key]["mean"] for p in curve])
            m = np.array([p["gain"]["mean"] for p in curve])
            ci = np.nan_to_num(np.array([p["gain"]["ci95"] for p in curve], float))
            ax.plot(x, m, marker="o", label=name, ls="--" if name == "shuffled" else "-")
            ax.fill_between(x, m - ci, m + ci, alpha=0.1)
    for ax, key, label in ((axes[0], "trajectories spent", f"sampled success ({st['eval_samples']}/prompt)"),
                           (axes[1], "generated tokens", "expert-trajectory probability")):
        ax.set_xlabel(key)
        ax.set_ylabel(f"held-out gain, {label}")
        ax.set_title(f"{st['task']} tiers, tiny model, {st['seeds']} seeds (95% CI over seeds)", fontsize=9)
        ax.legend(fontsize=7)
    names = [n for n in rows if "vs_pcl" in rows[n] or "vs_grpo" in rows[n]]
    for k, (base, color) in enumerate((("pcl", "tab:orange"), ("grpo", "tab:blue"))):
        means = [rows[n][f"vs_{base}"]["success"]["mean"] if f"vs_{base}" in rows[n] else np.nan for n in names]
        err = [[m - rows[n][f"vs_{base}"]["success"]["lo"] if f"vs_{base}" in rows[n] else 0 for n, m in
                zip(names, means)], [rows[n][f"vs_{base}"]["success"]["hi"] - m if f"vs_{base}" in rows[n] else 0
                                     for n, m in zip(names, means)]]
        axes[2].bar(np.arange(len(names)) + (k - 0.5) * 0.38, means, 0.38, yerr=np.nan_to_num(err), color=color,
                    label=f"minus {base}")
    axes[2].axhline(0, color="k", lw=0.8)
    axes[2].set_xticks(np.arange(len(names)), names, rotation=25, fontsize=7)
    axes[2].set_ylabel("seed-paired gain difference (sampled)")
    axes[2].set_title("each row's gain minus pcl's and grpo's, equal trajectories and optimiser steps", fontsize=9)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(payload: dict[str, Any], name: str, quick: bool) -> None:
    """Tables, headline, JSON and plot from the runs in ``payload``."""
    result = payload["learning"]
    st = result["settings"]
    befores = {int(s): v for s, v in result["before"].items()}
    runs = [{**r, "evals": {int(k): v for k, v in r["evals"].items()}} for r in result["runs"]]
    result["table"] = tabulate(runs, befores, st["rows"], st["mini_batches"])
    payload["headline"] = headline(result["table"], st["seeds"])
    print_tables(result["table"])
    print("\nheadline: " + json.dumps(payload["headline"]))
    path = write_json(name, payload)
    png = RESULTS / f"{name}.png"
    plot(result, png)
    print(f"\nwrote {path} and {png}; the runs took {payload['seconds']:.0f} s")
    if not quick:
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        (DOCS_IMG / "learning.png").write_bytes(png.read_bytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="grpo vs trace_plus, 1 seed, 2 steps of 32 trajectories, a 40-step warm start (CI)")
    parser.add_argument("--task", default="chain", choices=sorted(TASKS))
    parser.add_argument("--rows", nargs="*", default=None, choices=sorted(ROWS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--roots", type=int, default=64, help="M root rollouts per step")
    parser.add_argument("--multiplier", type=int, default=1, help="N continuations per root rollout")
    parser.add_argument("--mini-batches", type=int, default=8, help="optimiser steps per RL step, every row")
    parser.add_argument("--tasks", type=int, default=256, help="training prompts (revisited every few steps)")
    parser.add_argument("--pool", type=int, default=64, help="candidate prompts per step")
    parser.add_argument("--eval-tasks", type=int, default=200)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--eval-at", type=int, nargs="*", default=None, help="steps with a sampled held-out "
                        "evaluation (default: the last)")
    parser.add_argument("--expert-every", type=int, default=2, help="the expert probability alone every this many "
                        "steps (seconds each: the curve for comparisons at equal tokens)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--replot", action="store_true", help="tables and plot again from the last results JSON")
    args = parser.parse_args()
    quick = args.quick
    name = "learning_quick" if quick else "learning"
    if args.replot:
        report(json.loads((RESULTS / f"{name}.json").read_text()), name, quick)
        return
    if quick:
        args.seeds, args.steps, args.roots, args.eval_tasks, args.eval_samples = 1, 2, 16, 16, 1
    rows = tuple(args.rows or (("grpo", BEST) if quick else DEFAULT_ROWS))
    eval_at = sorted(set(args.eval_at or {args.steps}))
    task = TASKS[args.task]
    start = time.perf_counter()
    model = warm_model(task["env"], task["name"] + ("-quick" if quick else ""),
                       [*task["warm_overrides"], *(QUICK_WARM if quick else [])])
    base = {"task": args.task, "model": model, "steps": args.steps, "eval_at": eval_at, "eval_tasks": args.eval_tasks,
            "eval_samples": args.eval_samples, "pool": args.pool, "tasks": args.tasks, "roots": args.roots,
            "multiplier": args.multiplier, "mini_batches": args.mini_batches, "expert_every": args.expert_every,
            "threads": max(1, 2 // args.workers)}
    jobs = [{**base, "row": None, "seed": s} for s in range(args.seeds)]
    jobs += [{**base, "row": r, "seed": s} for s in range(args.seeds) for r in rows]
    os.environ.setdefault("OMP_NUM_THREADS", str(base["threads"]))
    with ProcessPoolExecutor(args.workers) as ex:
        futures = [ex.submit(train_run, job) for job in jobs]
        for k, future in enumerate(as_completed(futures), 1):
            if future.exception() is not None:  # fail fast: the other runs' figures would not make a table
                for other in futures:
                    other.cancel()
                raise future.exception()  # type: ignore[misc]
            r = future.result()
            print(f"[{k}/{len(jobs)}] {r['row'] or 'before'} seed {r['seed']} ({r['wall_s']:.0f} s)", flush=True)
        done = [f.result() for f in futures]
    settings = {**{k: v for k, v in base.items() if k != "threads"}, "rows": rows, "seeds": args.seeds,
                "env": task["env"], "tiers": task["tiers"], "learnable": task["learnable"],
                "trajectories_per_step": args.roots * (1 + args.multiplier), "row_settings": {r: ROWS[r] for r in rows},
                "best": BEST}
    result = {"settings": settings, "before": {r["seed"]: r["evals"][0] for r in done if r["row"] is None},
              "runs": [r for r in done if r["row"] is not None]}
    report({"machine": machine(), "seconds": time.perf_counter() - start, "learning": result}, name, quick)


if __name__ == "__main__":
    main()
