"""What TRACE buys, measured where it shows: held-out success per generated training token on arithmetic chains.

The registered experiment of docs/results.md ("Learning per generated token"), whose protocol was committed before
any of its runs: every row starts from the same committed warm start (``docs/data/learning_tokens/warm_start``),
spends 128 trajectories a step (64 roots x (1 + 1)) from a pool of 64 of 256 training prompts, and takes exactly
8 optimiser steps of mini-batch 32 at AdamW 2e-5 per RL step, for 12 steps. Rows: ``trace_plus`` (the variant as
registered, with the ``CALIBRATED`` predictor), ``pcl``, ``treepo`` (uniform roots, continuations at uniformly
random prefixes: any continuation's saving without TRACE's choice), ``grpo``, and the paper's ``trace``
(secondary). Seeds 0-9. The ``grpo`` and ``pcl`` rows train with tree GRPO like the others: on a flat group it
is GRPO's advantage plus a root sibling term, which on a two-turn chain gives the first turn twice GRPO's
advantage (the same estimator in every row).

Each run evaluates sampled held-out success (200 prompts x 4 samples, T = 1) at steps 4, 6, 8, 10 and 12 and the
probability of the expert's trajectory after every step; the evaluation before training is one per seed (every
row of a seed starts from the same weights and draws the same evaluation seeds). A run counts its cumulative
generated training tokens (``rollout/tokens``), the prefill tokens of its training generations, its update's
forward tokens, and its training wall-clock and CPU seconds (evaluations excluded).

**Primary**: the paired sampled gain (success minus the seed's success before, per prompt, averaged) of each run
at B = 45,000 cumulative generated training tokens, linear between the two evaluations that bracket B (the one
before training is the point (0 tokens, gain 0)); trace_plus minus pcl paired per seed, 95% t-interval over the
10 seeds. Pass: lower bound > 0; fail: upper bound < +0.015; otherwise inconclusive. A run whose last evaluation
is short of B uses its last evaluation's gain (a conservative reading for that row) and is counted in
``short_of_budget``. **Secondary**, two-sided paired t-tests with Holm's correction over the family: trace_plus
minus treepo and minus grpo at B; trace minus pcl at B; tokens to reach a sampled gain of +0.12 (per-seed log
ratio trace_plus / pcl, over the seeds where both reach it); the gain at step 8 (trace_plus minus pcl). Also at
B, each row's training wall-clock and CPU seconds, update forward tokens and prefill tokens (descriptive).

Runs survive interruption: a finished (row, seed) writes ``docs/data/learning_tokens/runs/<row>-s<seed>.json``
(committed) and is never run again; a run in progress checkpoints every step under ``runs/bench/learning_tokens``
and resumes from its last step; rows and seeds can be run in parts (``--rows``, ``--seeds``). ``--report``
builds ``docs/data/learning_tokens.json`` (the ``headline``) and ``docs/img/learning_tokens.png`` from the
committed run files alone. ``--quick`` runs 2 steps of one seed in ``runs/bench-quick`` and writes
``benchmarks/results/learning_quick.json``: it shows that the pipeline runs and its figures are not evidence.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import DOCS_IMG, RESULTS, machine, mean_ci, pyplot, train_config, warm_model, write_json

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "learning_tokens"
HEADLINE = ROOT / "docs" / "data" / "learning_tokens.json"
WORK = ROOT / "runs" / "bench" / "learning_tokens"
QUICK_WORK = ROOT / "runs" / "bench-quick" / "learning_tokens"

# Arithmetic chains (trace/ArithmeticChain-v0). guess: two statements, where the warm start's expert answered
# after the first call in half of its episodes (a decision taken at depth 1); tool: three statements, which it
# finishes; hard: five statements on 2-digit operands with values up to 99,999, outside its SFT.
ENV = "trace/ArithmeticChain-v0"
TIERS = {"guess": {"share": 0.3, "min_steps": 2, "max_steps": 2},
         "tool": {"share": 0.35, "min_steps": 3, "max_steps": 3},
         "hard": {"share": 0.35, "min_steps": 5, "max_steps": 5, "min_digits": 2, "max_digits": 2,
                  "max_value": 99_999}}
LEARNABLE = ("guess", "tool")
SFT_TIERS = {k: {**TIERS[k], "share": 0.5} for k in LEARNABLE}
EXPERT = {"guess": 0.5, "guess_tiers": ["guess"]}
WARM_OVERRIDES = [f"env.kwargs={json.dumps({'n_tasks': 2000, 'task_seed': 0, 'tiers': SFT_TIERS})}",
                  f"sft.expert={json.dumps(EXPERT)}"]
QUICK_WARM = ["sft.steps=40", "sft.episodes=400"]  # the quick run's warm start: the pipeline, not figures
# The variants' predictor: children targets, online recalibration, one epoch of replay (256 prompts over pools
# of 64). Named before any run of the learning benchmarks.
CALIBRATED = ["predictor.target=children", "predictor.calibrate=true", "predictor.replay=4"]
ROWS: dict[str, dict[str, Any]] = {
    "trace_plus": {"allocator": "trace_plus", "overrides": CALIBRATED},
    "pcl": {"allocator": "pcl"},
    "treepo": {"allocator": "treepo"},
    "grpo": {"allocator": "grpo"},
    "trace": {"allocator": "trace"},
}

# ------------------------------------------------------------------------- the protocol, as registered
REGISTERED_ROWS = ("trace_plus", "pcl", "treepo", "grpo", "trace")
SEEDS = tuple(range(10))
STEPS = 12
EVAL_AT = (4, 6, 8, 10, 12)
EVAL_TASKS, EVAL_SAMPLES = 200, 4
BUDGET = 45_000.0  # cumulative generated training tokens at which the primary is read
FAIL_MARGIN = 0.015  # fail when the interval's upper bound is below this
TARGET_GAIN = 0.12  # the secondary "tokens to reach" threshold (sampled gain)
STEP8 = 8
SETTINGS = {"tasks": 256, "pool": 64, "roots": 64, "multiplier": 1, "mini_batches": 8, "lr": 2e-5,
            "mini_batch": 32}
MEASURES = ("success", "expert")


# --------------------------------------------------------------------------------------------- runs
def run_name(row: str | None, seed: int) -> str:
    return f"{row}-s{seed}" if row else f"before-s{seed}"


def job_config(job: dict[str, Any], run_dir: Path) -> Any:
    """The training config of one (row, seed): the registered settings, the warm start as the model."""
    kwargs = {"n_tasks": job["tasks"], "task_seed": 0, "tiers": TIERS, **job.get("env_kwargs", {})}
    held_out = {"n_tasks": job["eval_tasks"], "task_seed": 1,
                "tiers": {k: {**v, "share": 1.0} for k, v in TIERS.items() if k in LEARNABLE}}
    row = ROWS[job["row"] or "grpo"]
    return train_config(ENV, run_dir, [
        f"model.path={job['model']}", "sft.enabled=false", f"seed={job['seed']}", f"env.kwargs={json.dumps(kwargs)}",
        f"env.eval_kwargs={json.dumps(held_out)}", f"alloc.allocator={row['allocator']}",
        f"alloc.roots={job['roots']}", f"alloc.multiplier={job['multiplier']}", f"alloc.pool_size={job['pool']}",
        f"steps={job['steps']}", "eval.every=0", f"eval.tasks={job['eval_tasks']}",
        f"eval.samples={job['eval_samples']}", "eval.expert=true", "checkpoint.keep=1",
        "log.plots=false", "log.save_trees=none", "env.workers=1", f"optim.lr={job['lr']}",
        f"optim.mini_batch={job['mini_batch']}", f"optim.mini_batches={job['mini_batches']}",
        *row.get("overrides", []), *job.get("overrides", [])])


class Meter:
    """Counts the work of a policy's ``generate`` calls while ``on`` (training rollouts, not evaluations)."""

    def __init__(self, policy: Any):
        self.on, self.prefill, self.decode = True, 0, 0
        inner: Callable[..., Any] = policy.generate

        def generate(*args: Any, **kwargs: Any) -> Any:
            out = inner(*args, **kwargs)
            if self.on and hasattr(policy, "stats"):
                self.prefill += int(policy.stats.prefill_tokens)
                self.decode += int(policy.stats.decode_tokens)
            return out

        policy.generate = generate


KEEP = ("rollout/tokens", "rollout/trajectories", "rollout/prompts", "rollout/success", "alloc/effective_ratio",
        "loss/forward_tokens", "loss/optimizer_steps", "loss/nodes", "alloc/prefix_anchors", "alloc/prefix_flips",
        "alloc/prefix_flips_expected", "predictor/prefix_ece", "eval/success", "eval/expert_prob")


def _write_atomic(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload) + "\n")
    tmp.replace(path)


def train_run(job: dict[str, Any]) -> dict[str, Any]:
    """One (row, seed), or the seed's evaluation before training (``row`` None): skipped when its result file
    exists, resumed from its last checkpoint when interrupted; returns the result (also written to the file)."""
    import torch

    from trace_gym.training.driver.checkpoint import latest_checkpoint
    from trace_gym.training.driver.trainer import Trainer
    from trace_gym.training.rollout.evaluate import expert_logprob, expert_sequences

    out = Path(job["data"]) / "runs" / f"{run_name(job['row'], job['seed'])}.json"
    if out.exists():
        return {**json.loads(out.read_text()), "skipped": True}
    torch.set_num_threads(job["threads"])
    run_dir = Path(job["work"]) / run_name(job["row"], job["seed"])
    progress_file = run_dir / "progress.json"
    ckpt = latest_checkpoint(run_dir) if progress_file.exists() else None
    progress: dict[str, Any] = {"rows": [], "evals": {}, "resumed_at": []}
    if ckpt is not None:
        saved = json.loads(progress_file.read_text())
        if saved["rows"] and saved["rows"][-1]["step"] == int(ckpt.name.split("_")[-1]):
            progress = {**saved, "resumed_at": [*saved["resumed_at"], saved["rows"][-1]["step"]]}
        else:
            ckpt = None
    trainer = Trainer(job_config(job, run_dir), resume=run_dir if ckpt is not None else None)
    meter = Meter(trainer.policy)
    totals = progress["rows"][-1] if progress["rows"] else {"train_wall_s": 0.0, "train_cpu_s": 0.0,
                                                             "prefill_tokens": 0.0, "decode_tokens": 0.0}
    wall, cpu = float(totals["train_wall_s"]), float(totals["train_cpu_s"])
    meter.prefill, meter.decode = int(totals["prefill_tokens"]), int(totals["decode_tokens"])
    load_start = os.getloadavg()[0]
    try:
        if job["row"] is None:
            meter.on = False
            trainer.evaluate()
            progress["evals"]["0"] = dict(trainer.history.eval_last or {})
        seqs = None
        while job["row"] is not None and trainer.step_count < job["steps"]:
            w0, c0 = time.perf_counter(), time.process_time()
            meter.on = True
            metrics = trainer.step()
            wall, cpu = wall + time.perf_counter() - w0, cpu + time.process_time() - c0
            meter.on = False
            step = trainer.step_count
            if step in job["eval_at"]:
                metrics.update(trainer.evaluate())
                progress["evals"][str(step)] = dict(trainer.history.eval_last or {})
            else:  # the expert probability alone: seconds
                seqs = seqs or expert_sequences(trainer.make_eval_env, trainer.eval_tasks, trainer.tokenizer)
                probs = np.exp(expert_logprob(trainer.learner.model, seqs, trainer.tokenizer.pad_token_id))
                progress["evals"][str(step)] = {"expert": probs.tolist()}
                metrics["eval/expert_prob"] = float(probs.mean())
            trainer.logger.log(step, metrics)
            progress["rows"].append({"step": step, **{k: float(metrics[k]) for k in KEEP if k in metrics},
                                     "train_wall_s": wall, "train_cpu_s": cpu, "prefill_tokens": meter.prefill,
                                     "decode_tokens": meter.decode})
            trainer.save_checkpoint()
            _write_atomic(progress_file, progress)  # after the step's checkpoint: a resume finds both
    finally:
        trainer.close()
    result = {"row": job["row"], "seed": job["seed"], "settings": {k: job[k] for k in PROTOCOL_KEYS},
              "code_commit": job["code_commit"], "machine": machine(), "threads": job["threads"],
              "load_at_start": load_start, "load_at_end": os.getloadavg()[0], **progress}
    _write_atomic(out, result)
    return result


PROTOCOL_KEYS = ("steps", "eval_at", "eval_tasks", "eval_samples", *SETTINGS)


def code_commit() -> str:
    """The commit of the tree this script runs from (``+dirty`` when it has uncommitted changes)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


# --------------------------------------------------------------------------------------------- figures
def t_quantile95(df: int) -> float:
    from trace_gym.training.stats import mean_ci95

    if df < 1:
        return float("nan")
    # mean_ci95's half-width over the values (-1, 1, 0, ..., 0) divided by their standard error
    values = [-1.0, 1.0] + [0.0] * (df - 1)
    half = mean_ci95(values)[1]
    return half / (np.std(values, ddof=1) / math.sqrt(len(values)))


def t_test(values: Sequence[float]) -> dict[str, float]:
    """Mean, 95% t-interval and two-sided p-value (against 0) over the finite values: {mean, lo, hi, p, n}."""
    x = np.array([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    n = len(x)
    if n < 2:
        return {"mean": float(x.mean()) if n else float("nan"), "lo": float("nan"), "hi": float("nan"),
                "p": float("nan"), "n": n}
    se = float(x.std(ddof=1) / math.sqrt(n))
    half = t_quantile95(n - 1) * se
    if se == 0:
        p = 0.0 if x.mean() != 0 else 1.0
    else:
        import mpmath

        t = float(x.mean()) / se
        df = n - 1
        p = float(mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True))
    return {"mean": float(x.mean()), "lo": float(x.mean() - half), "hi": float(x.mean() + half), "p": p, "n": n}


def holm(pvalues: dict[str, float], alpha: float = 0.05) -> dict[str, dict[str, float | bool]]:
    """Holm's step-down correction: per test its adjusted p-value and whether it is rejected at ``alpha``."""
    order = sorted((p if np.isfinite(p) else 1.0, k) for k, p in pvalues.items())
    m, running, out = len(order), 0.0, {}
    for i, (p, k) in enumerate(order):
        running = max(running, min(1.0, (m - i) * p))
        out[k] = {"p": pvalues[k], "p_holm": running, "rejected": running < alpha}
    return out


def gain_curve(run: dict[str, Any], before: dict[str, list[float]], measure: str) -> list[dict[str, float]]:
    """(step, cumulative generated training tokens, mean paired gain) at the start and at each evaluation of
    ``measure`` in ``run``; the start is (0, 0, 0)."""
    tokens = np.cumsum([r["rollout/tokens"] for r in run["rows"]]) if run["rows"] else np.zeros(0)
    out = [{"step": 0, "tokens": 0.0, "gain": 0.0}]
    for step, per_prompt in sorted((int(k), v) for k, v in run["evals"].items()):
        if step > 0 and measure in per_prompt:
            out.append({"step": step, "tokens": float(tokens[step - 1]),
                        "gain": float(np.mean(np.subtract(per_prompt[measure], before[measure])))})
    return out


def gain_at(curve: list[dict[str, float]], budget: float) -> tuple[float, bool]:
    """The gain at ``budget`` tokens, linear between the two points that bracket it, and whether the curve
    reaches it (if not: its last point's gain)."""
    if curve[-1]["tokens"] < budget:
        return curve[-1]["gain"], False
    return float(np.interp(budget, [p["tokens"] for p in curve], [p["gain"] for p in curve])), True


def tokens_to(curve: list[dict[str, float]], target: float) -> float:
    """Tokens at which the gain first reaches ``target``, linear between points; NaN if it never does."""
    for a, b in itertools.pairwise(curve):
        if b["gain"] >= target:
            if a["gain"] >= target:
                return a["tokens"]
            return a["tokens"] + (target - a["gain"]) / (b["gain"] - a["gain"]) * (b["tokens"] - a["tokens"])
    return float("nan")


def cost_at(run: dict[str, Any], key: str, budget: float) -> float:
    """A cumulative cost (training wall or CPU seconds, prefill tokens, update forward tokens) at ``budget``
    generated tokens, linear between steps; NaN when the run does not reach the budget."""
    tokens = np.concatenate([[0.0], np.cumsum([r["rollout/tokens"] for r in run["rows"]])])
    if key in ("loss/forward_tokens",):
        series = np.concatenate([[0.0], np.cumsum([r.get(key, 0.0) for r in run["rows"]])])
    else:
        series = np.concatenate([[0.0], [float(r[key]) for r in run["rows"]]])
    if tokens[-1] < budget:
        return float("nan")
    return float(np.interp(budget, tokens, series))


def analyse(runs: list[dict[str, Any]], befores: dict[int, dict[str, list[float]]],
            rows: Sequence[str] = REGISTERED_ROWS, budget: float = BUDGET) -> dict[str, Any]:
    """The registered analysis on the runs present: per row the gains at B, the costs at B, tokens to the target
    gain and the gain at step 8; the primary (trace_plus - pcl at B) with its verdict; the Holm-corrected
    secondary family. Only seeds with a before-evaluation count."""
    by = {(r["row"], r["seed"]): r for r in runs if r["seed"] in befores}
    curves = {k: {m: gain_curve(r, befores[k[1]], m) for m in MEASURES} for k, r in by.items()}
    per_row: dict[str, Any] = {}
    for row in rows:
        seeds = sorted(s for (r, s) in by if r == row)
        at_b = {s: gain_at(curves[(row, s)]["success"], budget) for s in seeds}
        per_row[row] = {
            "seeds": seeds,
            "gain_at_budget": mean_ci([at_b[s][0] for s in seeds]),
            "short_of_budget": [s for s in seeds if not at_b[s][1]],
            "gain_final": mean_ci([curves[(row, s)]["success"][-1]["gain"] for s in seeds]),
            "expert_gain_at_budget": mean_ci([gain_at(curves[(row, s)]["expert"], budget)[0] for s in seeds]),
            "tokens_per_step": mean_ci([float(np.mean([x["rollout/tokens"] for x in by[(row, s)]["rows"]]))
                                        for s in seeds]),
            "tokens_to_target": mean_ci([tokens_to(curves[(row, s)]["success"], TARGET_GAIN) for s in seeds]),
            "reached_target": sum(np.isfinite(tokens_to(curves[(row, s)]["success"], TARGET_GAIN)) for s in seeds),
            "effective_ratio": mean_ci([float(np.nanmean([x.get("alloc/effective_ratio", np.nan)
                                                          for x in by[(row, s)]["rows"]])) for s in seeds]),
            "at_budget": {key: mean_ci([cost_at(by[(row, s)], key, budget) for s in seeds])
                          for key in ("train_wall_s", "train_cpu_s", "prefill_tokens", "loss/forward_tokens")},
            "curve": [{"step": i, **{k: mean_ci([curves[(row, s)]["success"][i][k] for s in seeds])
                                     for k in ("tokens", "gain")}}
                      for i in range(min((len(curves[(row, s)]["success"]) for s in seeds), default=0))],
            "expert_curve": [{"step": i, **{k: mean_ci([curves[(row, s)]["expert"][i][k] for s in seeds])
                                            for k in ("tokens", "gain")}}
                             for i in range(min((len(curves[(row, s)]["expert"]) for s in seeds), default=0))],
        }

    def paired(a: str, b: str, value: Callable[[str, int], float]) -> dict[str, float]:
        seeds = [s for s in sorted(befores) if (a, s) in by and (b, s) in by]
        return t_test([value(a, s) - value(b, s) for s in seeds])

    def at_budget(row: str, seed: int) -> float:
        return gain_at(curves[(row, seed)]["success"], budget)[0]

    def at_step8(row: str, seed: int) -> float:
        point = [p for p in curves[(row, seed)]["success"] if p["step"] == STEP8]
        return point[0]["gain"] if point else float("nan")

    def log_tokens(row: str, seed: int) -> float:
        return math.log(tokens_to(curves[(row, seed)]["success"], TARGET_GAIN))

    primary = paired("trace_plus", "pcl", at_budget)
    verdict = ("pass" if primary["lo"] > 0 else "fail" if primary["hi"] < FAIL_MARGIN else "inconclusive") \
        if np.isfinite(primary["lo"]) else "not enough seeds"
    family = {"trace_plus_minus_treepo_at_budget": paired("trace_plus", "treepo", at_budget),
              "trace_plus_minus_grpo_at_budget": paired("trace_plus", "grpo", at_budget),
              "trace_minus_pcl_at_budget": paired("trace", "pcl", at_budget),
              "log_tokens_to_target_trace_plus_over_pcl": paired("trace_plus", "pcl", log_tokens),
              "trace_plus_minus_pcl_at_step8": paired("trace_plus", "pcl", at_step8)}
    corrected = holm({k: v["p"] for k, v in family.items()})
    secondary = {k: {**v, **corrected[k]} for k, v in family.items()}
    complete = all((r, s) in by for r in REGISTERED_ROWS for s in SEEDS) and set(SEEDS) <= set(befores)
    return {"rows": per_row, "primary": {**primary, "verdict": verdict if complete else f"incomplete: {verdict}"},
            "secondary": secondary, "complete": complete}


# --------------------------------------------------------------------------------------------- output
def interval(v: dict[str, float]) -> str:
    if not v or not np.isfinite(v.get("mean", float("nan"))):
        return "-"
    if not np.isfinite(v.get("lo", float("nan"))):
        return f"{v['mean']:+.3f}"
    return f"{v['mean']:+.3f} [{v['lo']:+.3f}, {v['hi']:+.3f}]"


def ci(v: dict[str, float], digits: int = 3) -> str:
    if not np.isfinite(v["mean"]):
        return "-"
    half = f" ± {v['ci95']:.{digits}f}" if np.isfinite(v["ci95"]) else ""
    return f"{v['mean']:.{digits}f}{half}"


def print_tables(table: dict[str, Any], budget: float) -> None:
    print(f"\nper row (mean ± 95% t-interval over seeds; B = {budget:,.0f} generated training tokens)")
    cols = ("seeds", "gain @B", "gain at end", "tokens/step", "tokens to +0.12", "wall s @B", "cpu s @B",
            "prefill @B", "update fwd @B")
    print(f"{'':12s}" + "".join(f"{c:>22s}" for c in cols))
    for name, g in table["rows"].items():
        b = g["at_budget"]
        vals = [str(len(g["seeds"])), ci(g["gain_at_budget"]), ci(g["gain_final"]), ci(g["tokens_per_step"], 0),
                f"{ci(g['tokens_to_target'], 0)} ({g['reached_target']})", ci(b["train_wall_s"], 0),
                ci(b["train_cpu_s"], 0), ci(b["prefill_tokens"], 0), ci(b["loss/forward_tokens"], 0)]
        print(f"{name:12s}" + "".join(f"{v:>22s}" for v in vals))
    p = table["primary"]
    print(f"\nprimary, trace_plus - pcl at B: {interval(p)} over {p['n']} seeds: {p['verdict']}")
    for k, v in table["secondary"].items():
        print(f"  {k}: {interval(v)} (n {v['n']}, p {v['p']:.3f}, Holm {v['p_holm']:.3f})")


def plot(table: dict[str, Any], path: Path, budget: float) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    for name, g in table["rows"].items():
        for ax, key in ((axes[0], "curve"), (axes[1], "expert_curve")):
            x = np.array([p["tokens"]["mean"] for p in g[key]])
            m = np.array([p["gain"]["mean"] for p in g[key]])
            half = np.nan_to_num(np.array([p["gain"]["ci95"] for p in g[key]], float))
            ax.plot(x, m, marker="o" if key == "curve" else None, label=f"{name} ({len(g['seeds'])} seeds)")
            ax.fill_between(x, m - half, m + half, alpha=0.1)
    for ax, label in ((axes[0], "sampled success (200 x 4, T = 1)"), (axes[1], "expert-trajectory probability")):
        ax.axvline(budget, color="k", lw=0.8, ls=":")
        ax.set_xlabel("cumulative generated training tokens")
        ax.set_ylabel(f"held-out gain, {label}")
        ax.legend(fontsize=7)
    fig.suptitle("arithmetic chains, tiny model: mean over seeds, 95% t-interval shaded; dotted: B", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_runs(data: Path) -> tuple[list[dict[str, Any]], dict[int, dict[str, list[float]]]]:
    files = sorted((data / "runs").glob("*.json"))
    loaded = [json.loads(f.read_text()) for f in files]
    befores = {r["seed"]: r["evals"]["0"] for r in loaded if r["row"] is None}
    return [r for r in loaded if r["row"] is not None], befores


def report(data: Path, out: Path, png: Path, protocol_commit: str, budget: float = BUDGET) -> dict[str, Any]:
    runs, befores = load_runs(data)
    rows = tuple(r for r in REGISTERED_ROWS if any(x["row"] == r for x in runs))
    table = analyse(runs, befores, rows, budget)
    print_tables(table, budget)
    headline = {"rows": list(rows), "seeds": sorted(befores), "budget_tokens": budget,
                "primary": {k: table["primary"][k] for k in ("mean", "lo", "hi", "n", "verdict")},
                "secondary": table["secondary"], "complete": table["complete"]}
    write_json(out.stem, {"protocol_commit": protocol_commit, "code_commits": sorted({r["code_commit"] for r in runs}),
                          "headline": headline, "table": table}, out.parent)
    plot(table, png, budget)
    print(f"\nwrote {out} and {png}")
    return headline


# The commit that registered the protocol in docs/results.md, before any run of it.
PROTOCOL_COMMIT = "d1d06495e9d2173f41c6151139d02b41acec57f2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="grpo and trace_plus, seed 0, 2 steps of 32 "
                        "trajectories from a 40-step warm start, in runs/bench-quick (not evidence)")
    parser.add_argument("--rows", nargs="*", default=None, choices=REGISTERED_ROWS)
    parser.add_argument("--seeds", nargs="*", type=int, default=None, help="default: the registered 0-9")
    parser.add_argument("--workers", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("--report", action="store_true", help="only the tables, headline and plot from the "
                        "committed run files")
    parser.add_argument("--data", type=Path, default=DATA, help="where finished runs are written")
    parser.add_argument("--work", type=Path, default=WORK, help="checkpoints of runs in progress")
    args = parser.parse_args()
    if args.report:
        report(args.data, HEADLINE, DOCS_IMG / "learning_tokens.png", PROTOCOL_COMMIT)
        return
    quick = args.quick
    rows = tuple(args.rows or (("grpo", "trace_plus") if quick else REGISTERED_ROWS))
    seeds = tuple(args.seeds if args.seeds is not None else ((0,) if quick else SEEDS))
    data, work = (QUICK_WORK / "data", QUICK_WORK / "work") if quick else (args.data, args.work)
    if quick:
        print("--quick: 2 steps of one seed, to show the pipeline runs; its figures are not evidence")
        model = warm_model(ENV, "chain-tiers-quick", [*WARM_OVERRIDES, *QUICK_WARM])
    else:
        model = str(data / "warm_start")
        if not (Path(model) / "config.json").exists():
            raise SystemExit(f"error: expected the registered warm start in {model}; fix: run from a checkout "
                             "that has docs/data/learning_tokens/warm_start")
    base = {"model": model, "steps": 2 if quick else STEPS, "eval_at": [2] if quick else list(EVAL_AT),
            "eval_tasks": 16 if quick else EVAL_TASKS, "eval_samples": 1 if quick else EVAL_SAMPLES,
            **SETTINGS, **({"roots": 16} if quick else {}), "threads": 1, "data": str(data), "work": str(work),
            "code_commit": code_commit()}
    jobs = [{**base, "row": row, "seed": s} for s in seeds for row in (None, *rows)]
    todo = [j for j in jobs if not (data / "runs" / f"{run_name(j['row'], j['seed'])}.json").exists()]
    print(f"{len(jobs) - len(todo)} of {len(jobs)} runs already done; {len(todo)} to run, {args.workers} at once")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as ex:
        futures = {ex.submit(train_run, job): job for job in todo}
        for k, future in enumerate(as_completed(futures), 1):
            job = futures[future]
            if future.exception() is not None:  # the others go on: each run is its own result file
                print(f"[{k}/{len(todo)}] {run_name(job['row'], job['seed'])} failed: {future.exception()!r}",
                      flush=True)
                continue
            print(f"[{k}/{len(todo)}] {run_name(job['row'], job['seed'])} done at "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
    if quick:
        runs, befores = load_runs(data)
        budget = min(sum(x["rollout/tokens"] for x in r["rows"]) for r in runs) / 2  # half the frugal run's
        table = analyse(runs, befores, rows, budget)
        print_tables(table, budget)
        write_json("learning_quick", {"not_evidence": True, "machine": machine(), "table": table}, RESULTS)
        print(f"\nwrote {RESULTS / 'learning_quick.json'} (not evidence)")
    else:
        report(data, HEADLINE, DOCS_IMG / "learning_tokens.png", PROTOCOL_COMMIT)


if __name__ == "__main__":
    main()
