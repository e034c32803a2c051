"""The training driver on the nano model: one step learns something; a resumed run equals an uninterrupted one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.training.parity_env import ENTRY_POINT
from trace_gym.training.config import TrainConfig
from trace_gym.training.driver.metrics_log import read_metrics
from trace_gym.training.driver.trainer import Trainer
from trace_gym.training.step import build_samples


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
    # annotated as the viewer reads them: each root's stage-1 decision, each trained node's advantage
    assert all(r["nodes"][0]["meta"]["alloc"]["stage"] == "root" for r in rows)
    assert any("advantage" in n["meta"] for r in rows for n in r["nodes"][1:])
    assert (tmp_path / "run" / "summary.json").is_file()
    assert (tmp_path / "run" / "plots" / "overview.png").stat().st_size > 1000


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


def test_trace_adaptive_and_predictor_memory_resume_from_a_checkpoint(tmp_path, nano_dir):
    from trace_gym.training.allocation.allocators import AdaptiveAllocator
    from trace_gym.training.allocation.predictor_wrappers import PromptPosterior, ReplayPredictor

    data = tiny_config(tmp_path / "run", nano_dir).to_dict()
    data["alloc"] = {**data["alloc"], "allocator": "trace_adaptive"}
    data["predictor"] = {"replay": 2, "prior_strength": 4.0}
    _run(TrainConfig.from_dict(data))  # one step (trust 0: two uniform groups of 3), then a checkpoint
    trainer = Trainer(TrainConfig.from_dict({**data, "steps": 2}), resume=tmp_path / "run")
    try:
        assert isinstance(trainer.allocator, AdaptiveAllocator) and len(trainer.allocator.records) == 2
        assert isinstance(trainer.predictor, PromptPosterior) and isinstance(trainer.predictor.inner, ReplayPredictor)
        assert len(trainer.predictor.inner.buffer) == 1 and trainer.predictor.counts
        metrics = trainer.step()
        assert metrics["alloc/trust_records"] == 4.0 and metrics["alloc/trust"] == 0.0  # below min_records
        assert metrics["predictor/prompts_seen"] >= 2 and len(trainer.predictor.inner.buffer) == 2
    finally:
        trainer.close()


def test_update_raises_positive_advantage_actions_relative_to_negative_ones(tmp_path, nano_dir):
    from trace_gym.training.update.batches import token_logprobs, update_batch

    cfg = tiny_config(tmp_path / "run", nano_dir)
    trainer = Trainer(cfg)
    try:
        result = trainer.rollout(1)  # the step without its update
        samples = build_samples(result.trees, cfg.optim.advantage).samples
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


def test_a_step_with_the_hidden_state_predictor_fits_its_head(tmp_path, nano_dir):
    from trace_gym.training.allocation.predictor import HiddenStatePredictor

    data = tiny_config(tmp_path / "run", nano_dir).to_dict()
    data["predictor"] = {"kind": "hidden", "steps": 5}
    trainer = Trainer(TrainConfig.from_dict(data))
    try:
        assert isinstance(trainer.predictor, HiddenStatePredictor)
        before = [p.detach().clone() for p in trainer.predictor.head.parameters()]
        metrics = trainer.step()
        assert metrics["predictor/examples"] > 0
        assert any(not torch.equal(a, b) for a, b in zip(before, trainer.predictor.head.parameters()))
    finally:
        trainer.close()
