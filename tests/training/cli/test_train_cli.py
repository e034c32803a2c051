"""`trace-gym train` and `eval` on a real (tiny) run folder: resuming a finished run says it is complete,
`eval --checkpoint RUN_DIR` reads the run's own config, and transformers' progress bars stay out of the output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.training.parity_env import ENTRY_POINT
from trace_gym.training.cli.main import main

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """Two training steps of the nano model on the parity env, through the command."""
    from trace_gym.agents.tiny import build_tiny_model

    base = tmp_path_factory.mktemp("cli_run")
    config = {
        "run_dir": str(base / "run"), "steps": 2,
        "model": {"path": str(build_tiny_model(base / "nano", size="nano", seed=0))},
        "env": {"id": ENTRY_POINT, "kwargs": {"n_tasks": 8}, "workers": 1},
        "rollout": {"max_new_tokens": 6, "max_context": 512},
        "alloc": {"allocator": "grpo", "roots": 4, "multiplier": 0, "pool_size": 4, "group_size": 2, "cap": 4},
        "optim": {"lr": 1e-3, "mini_batch": 4, "micro_batch": 4},
        "eval": {"every": 0, "tasks": 2},
        "checkpoint": {"every": 1},
        "log": {"progress": False, "plots": False},
    }
    (base / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(base / "config.yaml")]) == 0
    return base / "run"


def test_resuming_a_finished_run_says_it_is_complete(finished_run, capsys):
    metrics = (finished_run / "metrics.jsonl").read_text()
    assert main(["train", "--resume", str(finished_run)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "is complete: 2 of 2 steps" in out and "steps=4" in out
    assert (finished_run / "metrics.jsonl").read_text() == metrics


def test_eval_of_a_run_folder_reads_the_runs_own_config(finished_run, capsys):
    assert main(["eval", "--checkpoint", str(finished_run), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env"] == ENTRY_POINT and result["tasks"] == 2


def test_eval_of_one_checkpoint_folder_finds_the_runs_config(finished_run, capsys):
    step = finished_run / "checkpoints" / "step_000001"
    assert main(["eval", "--checkpoint", str(step), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == str(step / "model")


def test_transformers_progress_bars_stay_out_of_the_output(finished_run):
    result = subprocess.run([sys.executable, "-m", "trace_gym.training.cli", "eval", "--checkpoint", str(finished_run)],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Loading weights" not in result.stdout + result.stderr and "it/s]" not in result.stderr


def test_eval_of_a_run_takes_sampling_flags_as_overrides_and_writes_its_outputs(finished_run, capsys, tmp_path):
    out = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(finished_run), "--tasks", "1", "--samples", "3", "--temperature", "1",
                 "--out", str(out), "--trees", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["tasks"], summary["samples"], summary["episodes"], summary["temperature"]) == (1, 3, 3, 1.0)
    lo, hi = summary["success_ci95"]  # one task: Wilson's interval is wide, but it is one
    assert 0.0 <= lo <= summary["success"] <= hi <= 1.0 and hi - lo > 0.5
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [(r["task_id"], r["episode"]) for r in rows] == [(rows[0]["task_id"], k) for k in range(3)]
    assert main(["view", str(out / "trees.jsonl"), "--out", str(tmp_path / "trees.html")]) == 0
    capsys.readouterr()
    # the same evaluation resumed plays nothing again; other sampling is refused in one line
    assert main(["eval", "--checkpoint", str(finished_run), "--tasks", "1", "--samples", "3", "--temperature", "1",
                 "--out", str(out), "--trees", "--json", "--resume"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 3
    assert len((out / "rows.jsonl").read_text().splitlines()) == 3
    assert main(["eval", "--checkpoint", str(finished_run), "--tasks", "2", "--out", str(out), "--trees",
                 "--resume"]) == 2
    assert "got samples=1, tasks=2, temperature=0.0 where it ran with samples=3, tasks=1, temperature=1.0" in " ".join(
        capsys.readouterr().err.split())


def test_eval_of_a_run_prints_the_summary_table(finished_run, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # the model's path on one line
    assert main(["eval", "--checkpoint", str(finished_run)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "trace-gym eval" in out and "95% interval" in out and str(finished_run) in out


@pytest.mark.slow
def test_a_redirected_train_prints_progress_lines_during_sft_and_training(tmp_path):
    """`trace-gym train --config CFG > log 2>&1`, as a cluster job or nohup runs it: the log shows SFT and training
    progress as they go (count, rate, elapsed, ETA), not only the final table."""
    config = {
        "run_dir": str(tmp_path / "rl"), "steps": 3,
        "model": {"path": str(tmp_path / "init"), "init_size": "nano"},
        "sft": {"enabled": True, "output": str(tmp_path / "sft"), "episodes": 8, "steps": 4, "batch_size": 4},
        "env": {"id": "trace/Arithmetic-v0", "kwargs": {"n_tasks": 16, "word_fraction": 0.0},
                "eval_kwargs": {"n_tasks": 4, "task_seed": 1}, "workers": 1},
        "rollout": {"max_new_tokens": 8, "max_context": 512},
        "alloc": {"allocator": "grpo", "roots": 4, "multiplier": 0, "pool_size": 4, "group_size": 2, "cap": 4},
        "optim": {"lr": 1e-3, "mini_batch": 4, "micro_batch": 4},
        "eval": {"every": 0, "tasks": 2, "samples": 1, "expert": False},
        "checkpoint": {"every": 0},
        "log": {"progress": True, "plots": False},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    log = tmp_path / "log"
    env = {**os.environ, "TRACE_GYM_PROGRESS_INTERVAL": "0"}
    result = subprocess.run(f"{sys.executable} -m trace_gym.training.cli train --config {tmp_path / 'config.yaml'} "
                            f"> {log} 2>&1", shell=True, cwd=ROOT, env=env, timeout=900)
    text = log.read_text()
    assert result.returncode == 0, text[-3000:]
    lines = text.splitlines()
    sft = [line for line in lines if line.startswith("sft ")]
    train = [line for line in lines if line.startswith("train ")]
    assert [line.split(" | ")[0] for line in sft] == [f"sft {i}/4 {25 * i}%" for i in range(1, 5)]
    assert [line.split(" | ")[0] for line in train] == ["train 1/3 33%", "train 2/3 67%", "train 3/3 100%"]
    assert "eta " in sft[0] and "loss " in sft[0] and "elapsed" in train[-1]
    assert "step/s" in train[0] or "s/step" in train[0]  # the rate's unit follows the speed (slow when loaded)
    assert "\x1b[" not in text  # no terminal codes in a log


def test_a_runs_log_counts_the_evaluations_episodes_and_the_steps(finished_run, tmp_path):
    """Run with its stderr in a file (a cluster job's log): plain lines count each held-out evaluation's episodes
    as they end, and the steps, not only the end of each phase."""
    result = subprocess.run([sys.executable, "-m", "trace_gym.training.cli", "train", "--config",
                             str(finished_run / "config.yaml"), f"run_dir={tmp_path / 'run'}", "steps=1",
                             "log.progress=true"], capture_output=True, text=True, cwd=ROOT, timeout=600,
                            env={**os.environ, "TRACE_GYM_PROGRESS_INTERVAL": "0"})
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    evals = [line for line in lines if line.startswith("eval episodes ")]
    finished = [line.split(" | ")[0] for line in evals if " 2/2 " in line]
    assert finished == ["eval episodes 2/2 100%"] * 2  # before the first step and after the last
    assert any(line.startswith("train 1/1 100%") for line in lines)
