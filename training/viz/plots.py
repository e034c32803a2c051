"""PNG plots of training runs from ``RUN_DIR/metrics.jsonl`` (``trace-gym plot RUN_DIR [RUN_DIR ...]``).

Rendered with matplotlib's Agg through ``Figure`` objects (no pyplot, no display, no global backend change).

One panel per question; a panel draws whichever of its keys the run logged and is skipped (named in
``PlotResult.missing``) when none is there:
- success: ``rollout/success``, ``eval/success``
- effective ratio: ``alloc/effective_ratio``, ``alloc/effective_ratio_sample``
- predictor Brier: ``predictor/brier``, ``predictor/brier_true``, ``predictor/ece``
- reliability diagram: ``predictor/reliability``, a list of bins, each ``{"pred", "target", "weight"}`` (as
  ``training.metrics.reliability_bins`` writes them) or ``[mean_pred, mean_target, count]``
- budget per stage: ``alloc/roots`` (root stage) and ``alloc/continuations`` (prefix stage), else any
  ``budget/*``, else ``rollout/trajectories``
- tokens: ``rollout/generated_tokens``, ``rollout/tokens``
- time per stage: every ``time/<stage>`` (``time/step_s``, the total, is left out of the stack)
- contrastive pairs: ``alloc/pairs_per_1k_tokens``, else ``alloc/pairs_per_trajectory`` (scales differ)
Several run folders are overlaid, one colour each, labelled by run folder (the shortest path ending that tells
them apart) and ``summary.json``'s allocator where it differs from that name: ``seed0 (trace)``. The x axis
is the row's ``step`` (line index if absent).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from trace_gym.errors import ConfigError

__all__ = ["PANELS", "PlotResult", "Run", "load_run", "plot_run", "plot_runs"]


@dataclass
class Run:
    """One run folder's metric rows, with the label its lines get."""

    path: Path
    label: str
    rows: list[dict[str, Any]]
    skipped_lines: int = 0
    allocator: str | None = None
    """``summary.json``'s allocator, when the run wrote one."""

    def keys(self) -> set[str]:
        return {k for row in self.rows for k in row}

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """(steps, values) of the rows where ``key`` holds a finite number."""
        xs, ys = [], []
        for i, row in enumerate(self.rows):
            v = row.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                step = row.get("step", i)
                xs.append(float(step) if isinstance(step, int | float) else float(i))
                ys.append(float(v))
        return xs, ys


@dataclass
class PlotResult:
    """Files written, panels left out for lack of data (with the keys they looked for), runs read."""

    paths: list[Path] = field(default_factory=list)
    missing: dict[str, list[str]] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)


def load_run(run_dir: str | Path) -> Run:
    """Read ``metrics.jsonl``; unparsable lines (an interrupted write) are counted and skipped."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl" if run_dir.is_dir() else run_dir
    if not path.is_file():
        raise ConfigError(f"expected a run folder holding metrics.jsonl, got {run_dir}; fix: pass the run_dir "
                          "of a training run (the folder with metrics.jsonl)")
    rows, skipped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            skipped += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            skipped += 1
    folder = path.parent
    allocator = None
    summary = folder / "summary.json"
    if summary.is_file():
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            allocator = json.loads(summary.read_text()).get("allocator") or None
    run = Run(folder, folder.name, rows, skipped, str(allocator) if allocator is not None else None)
    run.label = run_labels([run])[0]
    return run


def run_labels(runs: Sequence[Run]) -> list[str]:
    """A label per run: the shortest ending of its folder path that no other run shares (``seed0``, or
    ``a/rl`` beside ``b/rl``), with the allocator in brackets when it is not that name."""
    parts = [run.path.resolve().parts for run in runs]
    depth = 1
    while depth < max(map(len, parts)) and len({p[-depth:] for p in parts}) < len(parts):
        depth += 1
    out = []
    for run, p in zip(runs, parts):
        name = "/".join(p[-depth:])
        out.append(name if run.allocator in (None, name) else f"{name} ({run.allocator})")
    return out


# ------------------------------------------------------------------------------------------------ panels
PanelFn = Callable[[Axes, Sequence[Run], Sequence[Any]], None]


def _lines(keys: Sequence[tuple[str, str, str]], first_only: bool = False) -> PanelFn:
    """A panel of one line per (key, legend text, line style) per run; ``first_only``: the first key logged."""

    def draw(ax: Axes, runs: Sequence[Run], colours: Sequence[Any]) -> None:
        for run, colour in zip(runs, colours):
            drawn = False
            for key, text, style in keys:
                xs, ys = run.series(key)
                if xs and not (first_only and drawn):
                    drawn = True
                    label = text if len(runs) == 1 else f"{run.label}: {text}"
                    ax.plot(xs, ys, style, color=colour, label=label, markersize=4)
        ax.legend(fontsize=8)

    return draw


def _reliability_points(value: Any) -> list[tuple[float, float, float]]:
    out = []
    for b in value if isinstance(value, list) else []:
        if isinstance(b, dict):
            p, t, w = b.get("pred"), b.get("target"), b.get("weight", b.get("count"))
        elif isinstance(b, list | tuple) and len(b) >= 3:
            p, t, w = b[0], b[1], b[2]
        else:
            continue
        finite = [float(x) for x in (p, t, w) if isinstance(x, int | float) and math.isfinite(x)]
        if len(finite) == 3 and finite[2] > 0:
            out.append((finite[0], finite[1], finite[2]))
    return out


def _reliability(ax: Axes, runs: Sequence[Run], colours: Sequence[Any]) -> None:
    ax.plot([0, 1], [0, 1], ":", color="grey", label="calibrated")
    for run, colour in zip(runs, colours):
        per_step = [(row.get("step", i), _reliability_points(row.get("predictor/reliability")))
                    for i, row in enumerate(run.rows)]
        per_step = [(s, pts) for s, pts in per_step if pts]
        if not per_step:
            continue
        name = "" if len(runs) == 1 else f"{run.label}: "
        step, last = per_step[-1]
        total = sum(w for _, _, w in last)
        ax.scatter([p for p, _, _ in last], [t for _, t, _ in last], s=[15 + 150 * w / total for _, _, w in last],
                   color=colour, alpha=0.8, label=f"{name}step {step} (size = weight)", zorder=3)
        ax.plot([p for p, _, _ in last], [t for _, t, _ in last], "-", color=colour, alpha=0.6)
        if len(per_step) > 1:
            # All steps pooled, re-binned on the prediction: the run's overall calibration.
            bins: dict[int, list[float]] = {}
            for _, pts in per_step:
                for p, t, w in pts:
                    acc = bins.setdefault(min(int(p * 10), 9), [0.0, 0.0, 0.0])
                    acc[0] += w * p
                    acc[1] += w * t
                    acc[2] += w
            pooled = [(a[0] / a[2], a[1] / a[2]) for _, a in sorted(bins.items())]
            ax.plot([p for p, _ in pooled], [t for _, t in pooled], "--", color=colour, alpha=0.6,
                    label=f"{name}all {len(per_step)} steps")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("predicted Ṽ")
    ax.set_ylabel("mean target V̂")
    ax.legend(fontsize=8, loc="upper left")


def _stacked(keys: Sequence[tuple[str, str]]) -> PanelFn:
    """Stacked bars of the keys per step for one run; a line per key and run for several."""

    def draw(ax: Axes, runs: Sequence[Run], colours: Sequence[Any]) -> None:
        present = [(k, t) for k, t in keys if any(run.series(k)[0] for run in runs)]
        if len(runs) > 1:
            styles = ["-", "--", ":", "-."]
            for run, colour in zip(runs, colours):
                for (key, text), style in zip(present, styles * len(present)):
                    xs, ys = run.series(key)
                    if xs:
                        ax.plot(xs, ys, style, color=colour, label=f"{run.label}: {text}")
            ax.legend(fontsize=8)
            return
        run = runs[0]
        steps = sorted({x for k, _ in present for x in run.series(k)[0]})
        bottom = [0.0] * len(steps)
        for key, text in present:
            lookup = dict(zip(*run.series(key)))
            ys = [lookup.get(s, 0.0) for s in steps]
            ax.bar(steps, ys, bottom=bottom, label=text, width=0.8)
            bottom = [b + y for b, y in zip(bottom, ys)]
        ax.legend(fontsize=8)

    return draw


def _budget_keys(runs: Sequence[Run]) -> list[tuple[str, str]]:
    keys = set().union(*(r.keys() for r in runs))
    staged = [(k, t) for k, t in (("alloc/roots", "root rollouts"), ("alloc/continuations", "continuations"))
              if k in keys]
    named = [(k, k.removeprefix("budget/")) for k in sorted(keys) if k.startswith("budget/")]
    return staged or named or [(k, "trajectories") for k in ("rollout/trajectories",) if k in keys]


def _time_keys(runs: Sequence[Run]) -> list[tuple[str, str]]:
    keys = set().union(*(r.keys() for r in runs))
    return [(k, k.removeprefix("time/").removesuffix("_s")) for k in sorted(keys)
            if k.startswith("time/") and k not in ("time/step_s", "time/step", "time/total_s")]


@dataclass(frozen=True)
class Panel:
    """One plot: file stem, title, y label, the keys it reads (a function of the runs' keys), the drawing."""

    name: str
    title: str
    ylabel: str
    keys: Callable[[Sequence[Run]], list[str]]
    draw: Callable[[Sequence[Run]], PanelFn]
    fraction: bool = False  # y in [0, 1]


def _fixed(keys: Sequence[str]) -> Callable[[Sequence[Run]], list[str]]:
    return lambda runs: list(keys)


_SUCCESS = [("rollout/success", "rollouts", "-"), ("eval/success", "eval", "o--")]
_EFFECTIVE = [("alloc/effective_ratio", "per prompt (mixed trees)", "-"),
              ("alloc/effective_ratio_sample", "per sample (A ≠ 0)", "--")]
_BRIER = [("predictor/brier", "Brier vs V̂", "-"), ("predictor/brier_true", "Brier vs true V", "--"),
          ("predictor/ece", "ECE", ":")]
_TOKENS = [("rollout/generated_tokens", "generated", "-"), ("rollout/tokens", "action tokens in trees", "--")]
_PAIRS = [("alloc/pairs_per_1k_tokens", "per 1k tokens", "-"), ("alloc/pairs_per_trajectory", "per trajectory", "--")]

PANELS: tuple[Panel, ...] = (
    Panel("success", "Success rate", "success", _fixed([k for k, _, _ in _SUCCESS]), lambda r: _lines(_SUCCESS),
          fraction=True),
    Panel("effective_ratio", "Effective ratio", "fraction", _fixed([k for k, _, _ in _EFFECTIVE]),
          lambda r: _lines(_EFFECTIVE), fraction=True),
    Panel("predictor_brier", "Predictor calibration", "error", _fixed([k for k, _, _ in _BRIER]),
          lambda r: _lines(_BRIER)),
    Panel("reliability", "Reliability diagram", "mean target V̂", _fixed(["predictor/reliability"]),
          lambda r: _reliability),
    Panel("budget", "Budget per stage (trajectories)", "trajectories",
          lambda runs: [k for k, _ in _budget_keys(runs)]
          or ["alloc/roots", "alloc/continuations", "budget/*", "rollout/trajectories"],
          lambda runs: _stacked(_budget_keys(runs))),
    Panel("tokens", "Tokens per step", "tokens", _fixed([k for k, _, _ in _TOKENS]), lambda r: _lines(_TOKENS)),
    Panel("time", "Time per stage", "seconds", lambda runs: [k for k, _ in _time_keys(runs)] or ["time/<stage>"],
          lambda runs: _stacked(_time_keys(runs))),
    Panel("pairs", "Contrastive sibling pairs", "pairs", _fixed([k for k, _, _ in _PAIRS]),
          lambda r: _lines(_PAIRS, first_only=True)),
)


def _has_data(panel: Panel, runs: Sequence[Run]) -> bool:
    if panel.name == "reliability":
        return any(_reliability_points(row.get("predictor/reliability")) for run in runs for row in run.rows)
    return any(run.series(k)[0] for run in runs for k in panel.keys(runs))


def _draw(ax: Axes, panel: Panel, runs: Sequence[Run], colours: Sequence[Any]) -> None:
    panel.draw(runs)(ax, runs, colours)
    ax.set_title(panel.title)
    if panel.name != "reliability":
        ax.set_xlabel("step")
        ax.set_ylabel(panel.ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if panel.fraction:
        ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)


def plot_runs(run_dirs: Iterable[str | Path], out_dir: str | Path | None = None) -> PlotResult:
    """Write ``overview.png`` (every panel with data) and one PNG per such panel into ``out_dir`` (default: the
    first run's ``plots/`` folder); panels without data are named in ``missing``."""
    runs = [load_run(d) for d in run_dirs]
    if not runs:
        raise ConfigError("expected at least one run folder, got none")
    for run, label in zip(runs, run_labels(runs)):
        run.label = label
    if not any(run.rows for run in runs):
        raise ConfigError(f"expected metric rows in {', '.join(str(r.path) for r in runs)}, got none; fix: "
                          "plot a run that has logged at least one step")
    out = Path(out_dir) if out_dir is not None else runs[0].path / "plots"
    out.mkdir(parents=True, exist_ok=True)
    colours = [matplotlib.colormaps["tab10"](i % 10) for i in range(len(runs))]
    result = PlotResult(runs=runs)
    present = []
    for panel in PANELS:
        if _has_data(panel, runs):
            present.append(panel)
        else:
            result.missing[panel.name] = panel.keys(runs)

    if not present:
        raise ConfigError(f"expected some of the plotted metric keys in {runs[0].path / 'metrics.jsonl'}, got "
                          f"none of {sorted(k for keys in result.missing.values() for k in keys)}")
    cols = min(4, len(present))
    nrows = math.ceil(len(present) / cols)
    # Figure objects without pyplot: PNGs are rendered by Agg, and a caller's pyplot backend is left alone.
    fig = Figure(figsize=(5 * cols, 3.8 * nrows))
    axes = fig.subplots(nrows, cols, squeeze=False)
    for ax, panel in zip(axes.flat, present):
        _draw(ax, panel, runs, colours)
    for ax in list(axes.flat)[len(present):]:
        ax.set_visible(False)
    fig.suptitle(" vs ".join(r.label for r in runs) + f" — {max(len(r.rows) for r in runs)} logged steps")
    fig.tight_layout()
    path = out / "overview.png"
    fig.savefig(path, dpi=100)
    result.paths.append(path)

    for panel in present:
        fig = Figure(figsize=(6, 4.2))
        ax = fig.subplots()
        _draw(ax, panel, runs, colours)
        fig.tight_layout()
        path = out / f"{panel.name}.png"
        fig.savefig(path, dpi=100)
        result.paths.append(path)
    return result


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Plots of one run (into ``RUN_DIR/plots`` by default); the PNG paths written. For the trainer's end."""
    return plot_runs([run_dir], out_dir).paths
