"""Building a run's parts from its config: env factories for registered ids and entry points, their tasks."""

from __future__ import annotations

import pytest

from tests.training.parity_env import ENTRY_POINT
from trace_gym.errors import ConfigError
from trace_gym.training.builders import dataset_of, make_env_factory, make_predictor
from trace_gym.training.config import TrainConfig
from trace_gym.training.predictor import FeaturePredictor


def test_an_entry_point_builds_an_unregistered_env_with_its_kwargs():
    make = make_env_factory(ENTRY_POINT, {"n_tasks": 5, "task_seed": 2})
    assert [t.id for t in dataset_of(make)] == [f"p2-{i}" for i in range(5)]


def test_a_registered_id_builds_its_env():
    tasks = dataset_of(make_env_factory("trace/Arithmetic-v0", {"n_tasks": 7}))
    assert len(tasks) == 7


def test_an_unknown_id_names_the_registered_ones():
    with pytest.raises(ConfigError, match=r"registered env id, got 'trace/Nope-v0'; fix: one of .*Arithmetic"):
        make_env_factory("trace/Nope-v0", {})


def test_the_feature_predictor_never_asks_for_hidden_states():
    cfg = TrainConfig.from_dict({"predictor": {"kind": "features", "lr": 0.02, "steps": 7}})
    predictor = make_predictor(cfg, lambda: pytest.fail("hidden states are not needed"))
    assert isinstance(predictor, FeaturePredictor) and (predictor.lr, predictor.steps) == (0.02, 7)
