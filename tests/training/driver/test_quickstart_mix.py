"""The two-env config end to end at nano size: a warm start over both envs' experts, one TRACE step on a pool
drawn across them, per-env metrics and held-out success per env."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from trace_gym.training.cli import train as cli
from trace_gym.training.driver.metrics_log import read_metrics

MIX = Path(__file__).resolve().parents[3] / "configs" / "quickstart_mix.yaml"
ENVS = ("Arithmetic", "ArithmeticChain")


@pytest.mark.slow
def test_two_env_config_reports_finite_per_env_figures(tmp_path):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([
        "--config", str(MIX), f"run_dir={tmp_path}/rl", f"model.path={tmp_path}/init", "model.init_size=nano",
        f"sft.output={tmp_path}/sft", "sft.episodes=16", "sft.steps=3", "sft.batch_size=4", "steps=2",
        "alloc.roots=4", "alloc.pool_size=4", "alloc.group_size=4", "alloc.cap=4", "rollout.max_new_tokens=12",
        "eval.tasks=2", "eval.samples=1", "env.mix.0.kwargs.n_tasks=20", "env.mix.1.kwargs.n_tasks=20",
        "env.mix.0.eval_kwargs.n_tasks=4", "env.mix.1.eval_kwargs.n_tasks=4", "env.workers=2", "log.progress=false",
        "log.plots=false",
    ])
    assert cli.run(args) == 0
    rows = read_metrics(tmp_path / "rl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for env in ENVS:
        for row in (rows[0], rows[-1]):  # held-out success per env, before and after
            assert 0 <= row[f"eval/{env}/success"] <= 1 and 0 <= row[f"eval/{env}/tool_use"] <= 1
        for row in rows[1:]:  # each step's pool of 4 candidates is drawn half from each env
            assert row[f"alloc/{env}/pool"] == 2
    for row in rows[1:]:  # the allocator chooses among them; the envs it gave rollouts have finite figures
        played = [env for env in ENVS if f"rollout/{env}/prompts" in row]
        assert played and all(math.isfinite(row[f"rollout/{env}/success"]) for env in played)
        # The per-env rollout figures add up to the step's own.
        assert sum(row[f"rollout/{env}/trajectories"] for env in played) == row["rollout/trajectories"]
        assert sum(row[f"rollout/{env}/prompts"] for env in played) == row["rollout/prompts"]
    summary = json.loads((tmp_path / "rl" / "summary.json").read_text())
    assert set(summary["envs"]) == set(ENVS)
    for env in ENVS:
        figures = summary["envs"][env]
        assert figures["tasks"] == 2 and figures["success_after"] == rows[-1][f"eval/{env}/success"]
        assert figures["success_before"] == rows[0][f"eval/{env}/success"]
