"""The training driver on the nano model: one step learns something; a resumed run equals an uninterrupted one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.training.parity_env import ENTRY_POINT
from trace_gym.training.config import TrainConfig
from trace_gym.training.logging import read_metrics
from trace_gym.training.trainer import Trainer


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
        assert any(not torch.equal(a, b) for a, b in zip(params, trainer.model.parameters()))
        assert not np.array_equal(w_before, trainer.predictor.state_dict()["w"])
    finally:
        trainer.close()


def _run(cfg: TrainConfig, resume=None) -> None:
    trainer = Trainer(cfg, resume=resume)
    try:
        trainer.train()
    finally:
        trainer.close()


def _comparable(rows):
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
    assert _comparable(full_rows) == _comparable(part_rows)
