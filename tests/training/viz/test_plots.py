"""Run plots from real metrics: a short trainer run of the nano model on the parity env, and the LLM-free
allocation loop (training.simulation) for runs long enough to compare allocators."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.parity_env import ENTRY_POINT
from trace_gym.errors import ConfigError
from trace_gym.training.allocation.allocators import make_allocator
from trace_gym.training.allocation.predictor import FeaturePredictor
from trace_gym.training.cli.main import main as cli_main
from trace_gym.training.config import StepBudget
from trace_gym.training.simulation import make_tasks, run_simulation
from trace_gym.training.viz.plots import _reliability_points, load_run, plot_run, plot_runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _simulated_run(folder: Path, allocator: str, steps: int = 6) -> Path:
    history = run_simulation(make_allocator(allocator, group_size=4, cap=8), FeaturePredictor(steps=20),
                             make_tasks(120, seed=0), StepBudget(8, 2), steps=steps, pool_size=24, seed=0)
    folder.mkdir(parents=True)
    with (folder / "metrics.jsonl").open("w") as f:
        f.writelines(json.dumps({"step": i, **m}) + "\n" for i, m in enumerate(history, 1))
    (folder / "summary.json").write_text(json.dumps({"allocator": allocator, "steps": steps}))
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("runs")
    return {name: _simulated_run(base / name, name) for name in ("trace", "grpo")}


def _is_png(path: Path) -> bool:
    return path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_MAGIC


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory) -> Path:
    """Three real training steps (nano model, parity env, TRACE allocator) with trees saved."""
    from trace_gym.agents.tiny import build_tiny_model
    from trace_gym.training.config import TrainConfig
    from trace_gym.training.driver.trainer import Trainer

    base = tmp_path_factory.mktemp("trained")
    cfg = TrainConfig.from_dict({
        "run_dir": str(base / "run"), "seed": 0, "steps": 3,
        "model": {"path": str(build_tiny_model(base / "nano", size="nano", seed=0))},
        "env": {"id": ENTRY_POINT, "kwargs": {"n_tasks": 12}, "workers": 2},
        "rollout": {"max_new_tokens": 6, "max_context": 512},
        "alloc": {"allocator": "trace", "roots": 6, "multiplier": 1, "pool_size": 4, "group_size": 3, "cap": 4},
        "optim": {"lr": 1e-3, "mini_batch": 8, "micro_batch": 4},
        "eval": {"every": 0, "tasks": 0},
        "checkpoint": {"every": 0},
        "log": {"progress": False, "save_trees": True},
    })
    trainer = Trainer(cfg)
    try:
        trainer.train()
    finally:
        trainer.close()
    return base / "run"


@pytest.mark.slow
def test_a_trainer_run_gets_every_panel(trainer_run, tmp_path):
    result = plot_runs([trainer_run], tmp_path)
    assert not result.missing, result.missing
    assert {p.stem for p in result.paths} == {"overview", "success", "effective_ratio", "predictor_brier",
                                              "reliability", "budget", "tokens", "time", "pairs"}
    assert all(_is_png(p) for p in result.paths)


@pytest.mark.slow
def test_the_viewer_reads_a_trainer_runs_trees(trainer_run):
    from trace_gym.training.viz.viewer import load_trees, page_data

    records = load_trees([trainer_run / "trees.jsonl"])
    assert sorted({r.step for r in records}) == [1, 2, 3]
    nodes = [n for t in page_data(records)["trees"] for n in t["nodes"]]
    assert any(n["predicted"] is not None for n in nodes)
    prefix = [n["alloc"] for n in nodes if n["alloc"] and n["alloc"].get("stage") == "prefix"]
    assert sum(a["continuations"] for a in prefix) == 3 * 6  # N·M continuations per step


def test_plot_run_writes_a_png_per_logged_panel(runs):
    paths = plot_run(runs["trace"])
    names = {p.stem for p in paths}
    assert {"overview", "success", "effective_ratio", "predictor_brier", "reliability", "pairs"} <= names
    assert all(p.parent == runs["trace"] / "plots" and _is_png(p) for p in paths)


def test_missing_keys_are_named_and_their_panels_skipped(runs, tmp_path):
    rows = load_run(runs["trace"]).rows
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({k: v for k, v in row.items() if not k.startswith("predictor/")}) + "\n" for row in rows))
    result = plot_runs([tmp_path])
    assert {"predictor_brier", "reliability", "time"} <= set(result.missing)
    assert "predictor/brier" in result.missing["predictor_brier"]
    stems = {p.stem for p in result.paths}
    assert "reliability" not in stems and "predictor_brier" not in stems and "success" in stems
    assert all(_is_png(p) for p in result.paths)


def test_several_runs_are_overlaid_with_their_allocator_labels(runs, tmp_path):
    result = plot_runs([runs["trace"], runs["grpo"]], tmp_path / "cmp")
    assert [r.label for r in result.runs] == ["trace", "grpo"]
    assert (tmp_path / "cmp" / "effective_ratio.png") in result.paths
    assert all(_is_png(p) for p in result.paths)


def test_both_reliability_bin_formats_give_the_same_points():
    dict_bins = [{"lo": 0.0, "hi": 0.5, "weight": 3.0, "pred": 0.2, "target": 0.4},
                 {"lo": 0.5, "hi": 1.0, "weight": 0.0, "pred": float("nan"), "target": float("nan")},
                 {"lo": 0.5, "hi": 1.0, "weight": 2.0, "pred": 0.7, "target": 0.5}]
    list_bins = [[0.2, 0.4, 3], [None, None, 0], [0.7, 0.5, 2]]
    assert _reliability_points(dict_bins) == _reliability_points(list_bins) == [(0.2, 0.4, 3.0), (0.7, 0.5, 2.0)]


def test_an_interrupted_last_line_is_skipped(runs, tmp_path):
    text = (runs["grpo"] / "metrics.jsonl").read_text()
    (tmp_path / "metrics.jsonl").write_text(text + text.splitlines()[-1][:40])
    run = load_run(tmp_path)
    assert run.skipped_lines == 1
    assert len(run.rows) == len(text.splitlines())


def test_a_folder_without_metrics_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"metrics\.jsonl"):
        plot_run(tmp_path)


def test_cli_plot_writes_files_and_names_what_is_missing(runs, tmp_path, capsys):
    assert cli_main(["plot", str(runs["trace"]), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'overview.png'}" in out
    assert "no time plot" in out
    assert cli_main(["plot", str(tmp_path / "nowhere")]) == 2  # a user error: one line, exit status 2


def test_runs_of_one_allocator_are_labelled_by_their_folders(tmp_path):
    a = _simulated_run(tmp_path / "seed0", "trace", steps=2)
    b = _simulated_run(tmp_path / "seed1", "trace", steps=2)
    assert [r.label for r in plot_runs([a, b], tmp_path / "cmp").runs] == ["seed0 (trace)", "seed1 (trace)"]


def test_runs_in_folders_of_one_name_are_labelled_by_the_path_that_tells_them_apart(tmp_path):
    a = _simulated_run(tmp_path / "a" / "rl", "trace", steps=2)
    b = _simulated_run(tmp_path / "b" / "rl", "grpo", steps=2)
    assert [r.label for r in plot_runs([a, b], tmp_path / "cmp").runs] == ["a/rl (trace)", "b/rl (grpo)"]
