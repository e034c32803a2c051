"""The training driver on the nano model: one step learns something; a resumed run equals an uninterrupted one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.training.parity_env import ENTRY_POINT
from trace_gym.tasks import Task
from trace_gym.training.allocators import StepBudget, make_allocator
from trace_gym.training.config import TrainConfig
from trace_gym.training.logging import read_metrics
from trace_gym.training.predictor import FeaturePredictor, Prefix, training_examples
from trace_gym.training.trainer import (
    Trainer,
    allocate_roots,
    annotate_roots,
    plan_continuations,
    plot_at_end,
    root_values,
)
from trace_gym.tree import RolloutTree


@pytest.fixture(scope="module")
def nano_dir(tmp_path_factory):
    from trace_gym.agents.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("nano"), size="nano", seed=0)


def tiny_config(run_dir, model_dir) -> TrainConfig:
    data = {
        "run_dir": str(run_dir), "seed": 0, "steps": 1,
        "model": {"path": str(model_dir)},
        "env": {"id": ENTRY_POINT, "kwargs": {"n_tasks": 12}, "eval_kwargs": {"task_seed": 1}, "workers": 2},
        "rollout": {"max_new_tokens": 6, "max_context": 512},
        "alloc": {"allocator": "trace", "roots": 6, "multiplier": 1, "pool_size": 4, "group_size": 3, "cap": 4},
        "optim": {"lr": 1e-3, "mini_batch": 8, "micro_batch": 4},
        "eval": {"every": 0, "tasks": 0},
        "checkpoint": {"every": 1},
        "log": {"progress": False},
    }
    return TrainConfig.from_dict(data)


def bare_trees(rewards: dict[str, list[float | None]]) -> dict[str, RolloutTree]:
    """Two-turn bare rollouts per task, final rewards as given; None: the rollout ends after one turn."""
    trees = {}
    for tid, outcomes in rewards.items():
        tree = RolloutTree(tid, f"prompt {tid}")
        for j, r in enumerate(outcomes):
            if r is None:
                tree.add(0, f"give up {j}", "", 0.0, terminated=True)
                continue
            mid = tree.add(0, f"{tid} think {j}", f"obs {j % 2}")
            tree.add(mid.id, f"answer {j}", "", r, terminated=True)
        trees[tid] = tree
    return trees


def annotated_step(seed: int = 0) -> tuple[dict[str, RolloutTree], dict[tuple[str, int], int], FeaturePredictor]:
    """Stage 1 on a pool of four prompts, hand-made bare rollouts, then stage 2, as the trainer runs them."""
    pool = [Task(id=f"t{i}", prompt=f"prompt t{i}") for i in range(4)]
    predictor = FeaturePredictor(steps=20)
    warm = bare_trees({"t0": [1.0, 0.0], "t1": [0.0, 0.0], "t2": [1.0, 1.0], "t3": [None, None]})
    predictor.fit(*training_examples(list(warm.values())))
    allocator, budget = make_allocator("trace", cap=3), StepBudget(roots=8, multiplier=2)
    rng = np.random.default_rng(seed)
    values = root_values(allocator, predictor, pool)
    roots, _ = allocate_roots(allocator, predictor, pool, budget, rng, values)
    outcomes = {"t0": [1.0, 0.0, 1.0], "t1": [0.0, 1.0, 0.0], "t2": [1.0, 1.0, 0.0], "t3": [None, None, None]}
    trees = bare_trees({tid: outcomes[tid][:m] for tid, m in roots.items()})
    annotate_roots(trees, pool, values, roots)
    plan, _ = plan_continuations(allocator, predictor, trees, roots, budget, rng)
    return trees, plan, predictor


def test_allocation_stages_write_the_viewer_meta():
    trees, plan, predictor = annotated_step()
    assert sum(plan.values()) == 2 * sum(t.root.meta["alloc"]["continuations"] for t in trees.values())  # N·m_i
    for tid, tree in trees.items():
        root = tree.root.meta
        v, m = root["predicted"], root["alloc"]["continuations"]
        assert v == pytest.approx(predictor.predict([Prefix(tid, f"prompt {tid}")])[0])
        assert root["alloc"] == {"continuations": m, "utility": pytest.approx(1 - v**m - (1 - v) ** m),
                                 "stage": "root"}
        assert root.get("root_extra", 0) == plan.get((tid, 0), 0)
        for node in tree.nodes[1:]:
            assert "value" not in node.meta and "continuations" not in node.meta  # the old keys are gone
            if node.is_terminal:
                assert not node.meta
                continue
            v = node.meta["predicted"]
            assert v == pytest.approx(predictor.predict([Prefix.from_tree(tree, node.id)])[0])
            k = plan.get((tid, node.id), 0)
            if k == 0:
                assert "alloc" not in node.meta
                continue
            r = tree.value(node.id)
            q = r * v + (1 - r) * (1 - v)
            assert node.meta["alloc"] == {"continuations": k, "utility": pytest.approx(1 - q**k), "stage": "prefix"}


def test_annotated_trees_round_trip_through_json_and_the_viewer(tmp_path):
    from trace_gym.training.viewer import load_trees, page_data

    trees, plan, _ = annotated_step()
    path = tmp_path / "trees.jsonl"
    path.write_text("".join(json.dumps({"step": 1, **t.to_dict()}) + "\n" for t in trees.values()))
    assert [RolloutTree.from_json(t.to_json()).to_dict() for t in trees.values()] == [
        t.to_dict() for t in trees.values()]
    shown = page_data(load_trees([path]))["trees"]
    assert [t["task_id"] for t in shown] == list(trees)
    for data, tree in zip(shown, trees.values()):
        assert [n["predicted"] for n in data["nodes"]] == [n.meta.get("predicted") for n in tree.nodes]
        assert [n["alloc"] for n in data["nodes"]] == [n.meta.get("alloc") for n in tree.nodes]
    assert sum(n["alloc"]["continuations"] for t in shown for n in t["nodes"]
               if n["alloc"] and n["alloc"]["stage"] == "prefix") == sum(k for (_, n), k in plan.items() if n)


def test_one_step_changes_parameters_and_predictor(tmp_path, nano_dir):
    trainer = Trainer(tiny_config(tmp_path / "run", nano_dir))
    try:
        params = [p.detach().clone() for p in trainer.model.parameters()]
        w_before = trainer.predictor.state_dict()["w"].copy()
        metrics = trainer.step()
        assert metrics["rollout/trajectories"] == 12 == metrics["alloc/budget"]  # M·(1+N)
        assert metrics["loss/nodes"] > 0
        # scored before the first fit: every root at 0.5, so no ranking, and a Brier of at most 0.25
        assert np.isnan(metrics["predictor/root_rank_corr"]) and 0 <= metrics["predictor/root_brier"] <= 0.25
        assert any(not torch.equal(a, b) for a, b in zip(params, trainer.model.parameters()))
        assert not np.array_equal(w_before, trainer.predictor.state_dict()["w"])
    finally:
        trainer.close()


def test_train_saves_the_chosen_steps_trees_and_plots(tmp_path, nano_dir):
    data = tiny_config(tmp_path / "run", nano_dir).to_dict()
    data.update(steps=3, checkpoint={"every": 0, "keep": 1})
    data["log"]["save_trees"] = 2
    _run(TrainConfig.from_dict(data))
    rows = [json.loads(line) for line in (tmp_path / "run" / "trees.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rows}) == [2, 3]  # every 2nd step and the last
    assert (tmp_path / "run" / "summary.json").is_file()
    assert (tmp_path / "run" / "plots" / "overview.png").stat().st_size > 1000


def test_a_plotting_failure_is_reported_not_raised(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")  # a run folder without rows: plot_run raises ConfigError
    with pytest.warns(RuntimeWarning, match="plots of .* skipped: ConfigError"):
        assert plot_at_end(tmp_path) == []


def _run(cfg: TrainConfig, resume=None) -> None:
    trainer = Trainer(cfg, resume=resume)
    try:
        trainer.train()
    finally:
        trainer.close()


def comparable(rows):
    return [{k: v for k, v in row.items() if not k.startswith("time/") and not k.endswith("_s")} for row in rows]


@pytest.mark.slow
def test_resumed_run_equals_uninterrupted_run(tmp_path, nano_dir):
    _run(TrainConfig.from_dict({**tiny_config(tmp_path / "full", nano_dir).to_dict(), "steps": 2}))
    part = tiny_config(tmp_path / "part", nano_dir)  # stops after step 1 with a checkpoint
    _run(part)
    resumed = TrainConfig.from_dict({**part.to_dict(), "steps": 2})
    _run(resumed, resume=tmp_path / "part")
    full_rows, part_rows = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "part")
    assert [r["step"] for r in part_rows] == [1, 2]
    assert comparable(full_rows) == comparable(part_rows)


def test_update_raises_positive_advantage_actions_relative_to_negative_ones(tmp_path, nano_dir):
    from trace_gym.training.distributed import token_logprobs
    from trace_gym.training.learner import update_batch
    from trace_gym.training.trainer import build_samples

    cfg = tiny_config(tmp_path / "run", nano_dir)
    trainer = Trainer(cfg)
    try:
        rng = np.random.default_rng(0)
        pool = trainer.stream.take(cfg.alloc.pool_size)
        values = root_values(trainer.allocator, trainer.predictor, pool)
        roots, _ = allocate_roots(trainer.allocator, trainer.predictor, pool, trainer.budget, rng, values)
        trainer.collector.begin_step()
        trainer.collector.bare_rollouts(roots, seed=1)
        plan, _ = plan_continuations(trainer.allocator, trainer.predictor, trainer.collector.trees, roots,
                                     trainer.budget, rng)
        trainer.collector.continuations(plan, seed=2)
        samples = build_samples(list(trainer.collector.trees.values()), cfg.optim.advantage)
        adv = np.array([s.advantage for s in samples])
        assert (adv > 0).any() and (adv < 0).any()

        def action_logprobs() -> np.ndarray:
            with torch.no_grad():
                b = update_batch(samples, trainer.tokenizer.pad_token_id)
                return (token_logprobs(trainer.model, b.input_ids, b.attention_mask) * b.loss_mask).sum(-1).numpy()

        before = action_logprobs()
        trainer.learner.update(samples, 0, trainer.tokenizer.pad_token_id)
        change = action_logprobs() - before
        assert change[adv > 0].mean() > change[adv < 0].mean()
    finally:
        trainer.close()


def test_a_fresh_run_in_a_used_folder_starts_a_new_metrics_file(tmp_path, nano_dir):
    data = tiny_config(tmp_path / "run", nano_dir).to_dict()
    data["eval"] = {"every": 0, "tasks": 2, "samples": 1}  # evaluation logs a step-0 row
    for _ in range(2):
        _run(TrainConfig.from_dict(data))
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [0, 1]
