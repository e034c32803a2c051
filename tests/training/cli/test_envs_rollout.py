"""`trace-gym rollout` through the real command: tree rollouts of any policy (the noisy expert by default, a
model folder) written as JSONL trees that `trace-gym view` renders, with `--branches` continuations from visited
turns, reproducible by `--seed`, and bad flags as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_gym.training.cli.main import main
from trace_gym.training.viz.viewer import load_trees


def rollout(capsys, tmp_path: Path, *argv: str, out: str = "trees.jsonl") -> tuple[dict, Path]:
    path = tmp_path / out
    assert main(["rollout", *argv, "--out", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out), path


def test_the_noisy_expert_writes_trees_with_mixed_outcomes(capsys, tmp_path):
    summary, path = rollout(capsys, tmp_path, "--env", "trace/HotpotQA-v0", "--tasks", "6", "--branches", "3")
    trees = [r.tree for r in load_trees([path])]
    assert len(trees) == 6 and all(len(t.leaves()) == 4 for t in trees)  # one bare rollout + 3 continuations
    assert summary["policy"] == "expert:0.3" and summary["episodes"] == 24
    assert summary["mixed_tasks"] == sum(t.is_mixed() for t in trees) > 0


def test_continuations_start_from_visited_turns(capsys, tmp_path):
    _, path = rollout(capsys, tmp_path, "--env", "trace/Arithmetic-v0", "--env-arg", "n_tasks=8",
                      "--policy", "expert:0.5", "--tasks", "8", "--branches", "4")
    trees = [r.tree for r in load_trees([path])]
    # some branch leaves from inside an episode (a node below the root), not only from the prompt
    assert any(n.parent not in (None, 0) and len(trees[i][n.parent].children) > 1
               for i, t in enumerate(trees) for n in t.nodes[1:])


def test_the_seed_repeats_a_rollout(capsys, tmp_path):
    args = ("--env", "trace/Arithmetic-v0", "--env-arg", "n_tasks=5", "--policy", "expert:0.5", "--tasks", "5")
    _, a = rollout(capsys, tmp_path, *args, "--seed", "3", out="a.jsonl")
    _, b = rollout(capsys, tmp_path, *args, "--seed", "3", out="b.jsonl")
    _, c = rollout(capsys, tmp_path, *args, "--seed", "4", out="c.jsonl")
    assert a.read_text() == b.read_text() != c.read_text()


def test_a_folder_out_holds_trees_rows_and_the_summary_and_view_renders_it(capsys, tmp_path):
    summary, out = rollout(capsys, tmp_path, "--env", "trace/Arithmetic-v0", "--env-arg", "n_tasks=3",
                           "--tasks", "3", "--branches", "1", out="run")
    names = sorted(p.name for p in out.iterdir())
    assert names == ["rows.jsonl", "rows.settings.json", "summary.json", "trees.jsonl"]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]  # one row per episode
    assert sorted((r["task_id"], r["episode"]) for r in rows) == [(t, e) for t in ("arith-0", "arith-1", "arith-2")
                                                                   for e in (0, 1)]
    assert summary["files"]["trees"] == str(out / "trees.jsonl")
    assert main(["view", str(out)]) == 0 and (out / "trees.html").is_file()


@pytest.fixture(scope="module")
def nano_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("model") / "nano"
    assert main(["model", "init", "--out", str(folder), "--size", "nano"]) == 0
    return folder


def test_a_model_folder_rolls_out_with_branches(capsys, tmp_path, nano_dir):
    capsys.readouterr()
    summary, path = rollout(capsys, tmp_path, "--env", "trace/Arithmetic-v0", "--env-arg", "n_tasks=2",
                            "--policy", str(nano_dir), "--tasks", "2", "--branches", "1", "--max-new-tokens", "4")
    trees = [r.tree for r in load_trees([path])]
    assert summary["episodes"] == 4 and all(len(t.leaves()) == 2 for t in trees)
    assert all(n.token_ids for t in trees for n in t.nodes[1:])


def test_negative_branches_are_one_line(capsys, tmp_path):
    argv = ["rollout", "--env", "trace/Arithmetic-v0", "--branches", "-1", "--out", str(tmp_path / "t.jsonl")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: expected --branches >= 0") and len(err.strip().splitlines()) == 1
