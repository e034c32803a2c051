"""Building a run's parts from its config (env specs themselves: tests/trace_gym/test_env_specs.py)."""

from __future__ import annotations

import pytest

from trace_gym.training.builders import make_predictor
from trace_gym.training.config import TrainConfig
from trace_gym.training.predictor import FeaturePredictor


def test_the_feature_predictor_never_asks_for_hidden_states():
    cfg = TrainConfig.from_dict({"predictor": {"kind": "features", "lr": 0.02, "steps": 7}})
    predictor = make_predictor(cfg, lambda: pytest.fail("hidden states are not needed"))
    assert isinstance(predictor, FeaturePredictor) and (predictor.lr, predictor.steps) == (0.02, 7)
