"""Helpers shared by the allocation and learning benchmarks: intervals, JSON output, tables, plot setup."""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trace_gym.training.stats import mean_ci95

RESULTS = Path(__file__).parent / "results"
DOCS_IMG = Path(__file__).parent.parent / "docs" / "img"

def mean_ci(values: Sequence[float]) -> dict[str, float]:
    """Mean and 95% t-interval half-width over independent seeds (NaNs dropped); n = seeds used."""
    mean, ci95, n = mean_ci95(values)
    return {"mean": mean, "ci95": ci95, "n": n}


def fmt(stat: dict[str, float], digits: int = 3) -> str:
    """'0.612 ± 0.021' (or just the mean when there is no interval)."""
    if not math.isfinite(stat["mean"]):
        return "n/a"
    if not math.isfinite(stat["ci95"]):
        return f"{stat['mean']:.{digits}f}"
    return f"{stat['mean']:.{digits}f} ± {stat['ci95']:.{digits}f}"


def machine() -> dict[str, Any]:
    """What the numbers ran on (cores visible to this process, Python, numpy)."""
    return {"cpus": len(os.sched_getaffinity(0)), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__, "gpu": False}


def write_json(name: str, payload: dict[str, Any], folder: Path = RESULTS) -> Path:
    """<folder>/<name>.json, by default benchmarks/results (NaN written as null)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(_clean(payload), indent=1) + "\n")
    return path


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, float | np.floating):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ci_bars(ax: Any, rows: dict[str, dict[str, Any]], series: Sequence[tuple[str, str]], rotation: int = 0,
            fontsize: int = 8) -> None:
    """Grouped bars on ``ax``: per row label, one bar per (stat key, colour) with its 95% interval."""
    labels = list(rows)
    x = np.arange(len(labels))
    width = 0.8 / len(series)
    for k, (key, color) in enumerate(series):
        means = [rows[lab][key]["mean"] for lab in labels]
        errs = [np.nan_to_num(rows[lab][key]["ci95"] if rows[lab][key]["ci95"] is not None else np.nan)
                for lab in labels]
        ax.bar(x + (k - (len(series) - 1) / 2) * width, means, width, yerr=errs, color=color,
               label=key.replace("_", " "))
    ax.set_xticks(x, labels, rotation=rotation, fontsize=fontsize)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=fontsize)


# ----------------------------------------------------------------- the tiny model on real envs (trainer API)
QUICKSTART = Path(__file__).parent.parent / "configs" / "quickstart.yaml"
# The always-tool setting (400 SFT steps, the default Arithmetic mix) that the allocation benchmark and the
# learning studies of docs/learning.md sections 1-4 were measured on; the quickstart has moved on since.
COPYING = Path(__file__).parent.parent / "configs" / "quickstart_copying.yaml"
BENCH_RUNS = Path(__file__).parent.parent / "runs" / "bench"
ENV_OVERRIDES: dict[str, list[str]] = {  # per env: config overrides on top of the base config
    "trace/Arithmetic-v0": [],
    # Tag format (compact prompt) and short observations: episodes of ~750 byte tokens fit the tiny model's SFT
    # and rollout context; 16 episodes per SFT step keep the warm start near 9 minutes on 2 cores.
    "trace/HotpotQA-v0": ["env.kwargs={action_format: tags, top_k: 1, max_passage_chars: 200}", "sft.expert={}",
                          "env.eval_kwargs={}", "rollout.max_context=2048", "sft.batch_size=16"],
}


def env_short(env_id: str) -> str:
    return env_id.split("/")[-1].split("-")[0].lower()


def train_config(env_id: str, run_dir: Path, overrides: Sequence[str] = (), config: Path = QUICKSTART) -> Any:
    """``config`` (the quickstart's by default) pointed at ``env_id`` and a warm-started model under
    runs/bench/<env>/."""
    from trace_gym.training.config import load_config

    base = BENCH_RUNS / env_short(env_id)
    return load_config(config, [f"env.id={env_id}", f"model.path={base}/model-init",
                                    f"sft.output={base}/model-sft", f"run_dir={run_dir}", "log.progress=false",
                                    *ENV_OVERRIDES.get(env_id, []), *overrides])


def warm_model(env_id: str, name: str | None = None, overrides: Sequence[str] = (),
               config: Path = QUICKSTART) -> str:
    """Build and SFT the tiny model on ``env_id``'s scripted expert once (cached under runs/bench/``name``,
    default the env's short name; ``config`` and ``overrides`` set the warm start); returns the model folder."""
    from rich.console import Console

    from trace_gym.env_specs import env_factory
    from trace_gym.training.driver.warm_start import warm_start

    base = BENCH_RUNS / (name or env_short(env_id))
    cfg = train_config(env_id, base / "warm", [f"model.path={base}/model-init", f"sft.output={base}/model-sft",
                                               *overrides], config)
    # A console shows the build and the SFT's progress: a cold warm start takes minutes.
    return warm_start(cfg, env_factory(cfg.env.id, cfg.env.kwargs), console=Console(stderr=True))
