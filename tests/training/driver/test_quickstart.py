"""The quickstart path end to end at nano size: build the model, SFT warm start, one TRACE step through the
CLI, a run folder and the final table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from trace_gym.training.cli import train as cli
from trace_gym.training.driver.metrics_log import read_metrics

QUICKSTART = Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml"


@pytest.mark.slow
def test_quickstart_pipeline_writes_a_run_folder_and_table(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([
        "--config", str(QUICKSTART), f"run_dir={tmp_path}/rl", f"model.path={tmp_path}/init", "model.init_size=nano",
        f"sft.output={tmp_path}/sft", "sft.episodes=16", "sft.steps=3", "sft.batch_size=4", "steps=1",
        "alloc.roots=4", "alloc.pool_size=4", "alloc.group_size=4", "alloc.cap=4", "rollout.max_new_tokens=12",
        "eval.tasks=3", "eval.samples=2", "eval.expert=true", "env.kwargs.n_tasks=20", "env.eval_kwargs.n_tasks=4",
        "log.progress=false",
    ])
    assert cli.run(args) == 0
    assert (tmp_path / "sft" / "config.json").is_file() and (tmp_path / "sft" / "sft_log.jsonl").is_file()
    rows = read_metrics(tmp_path / "rl")
    assert [r["step"] for r in rows] == [0, 1] and "eval/success" in rows[0] and "eval/success" in rows[1]
    assert rows[1]["alloc/budget"] == 8  # M·(1+N) trajectories
    summary = json.loads((tmp_path / "rl" / "summary.json").read_text())
    assert summary["trajectories"] == 8 and summary["success_before"] is not None
    # Held-out success comes with the evaluation's own Wilson interval over prompts, before and after.
    for key, row in (("success_before_ci95", rows[0]), ("success_after_ci95", rows[1])):
        assert summary[key] == pytest.approx([row["eval/success_lo"], row["eval/success_hi"]])
    assert (tmp_path / "rl" / "checkpoints" / "step_000001" / "model" / "config.json").is_file()
    # The run's held-out gain is paired over the same prompts: its mean is the difference of the two evals.
    gain = summary["gain"]
    assert set(gain) == {"success", "expert", "tool_use"} and gain["success"]["tasks"] == 3
    assert (summary["tool_use_before"], summary["tool_use_after"]) == (rows[0]["eval/tool_use"],
                                                                       rows[1]["eval/tool_use"])
    log = (tmp_path / "rl" / "train.log").read_text().splitlines()  # progress a user can tail -f
    assert [line.split(" step ")[1].split()[0] for line in log] == ["0", "1"] and "eval/success" in log[1]
    assert gain["success"]["mean"] == pytest.approx(rows[1]["eval/success"] - rows[0]["eval/success"])
    assert gain["expert"]["mean"] == pytest.approx(rows[1]["eval/expert_prob"] - rows[0]["eval/expert_prob"])
    assert 0 < rows[0]["eval/expert_prob"] < 1
    assert gain["expert"]["lo"] <= gain["expert"]["mean"] <= gain["expert"]["hi"]
    out = capsys.readouterr().out
    assert "held-out success before" in out and "expert-probability gain" in out and "held-out tool use after" in out
    lo, hi = summary["success_after_ci95"]
    assert f"{summary['success_after']:.3f} [{lo:.3f}, {hi:.3f}]" in out
    # The SFT warm start ran in this command: the table shows its time beside RL's, and the total holds both.
    assert summary["warm_start_s"] > 0 and "wall time: warm start, SFT (s)" in out
    total = next(line for line in out.splitlines() if "wall time: total" in line)
    assert float(total.split()[-2]) == pytest.approx(summary["wall_s"] + summary["warm_start_s"], abs=1e-3)
