"""The run's history: typed, through the checkpoint's plain dict and back, older checkpoints included."""

from __future__ import annotations

import math

from trace_gym.training.driver.history import RunHistory


def test_history_round_trips_through_its_dict():
    h = RunHistory()
    h.add_eval(0, 0.25, 0.5, {"success": [0.0, 0.5]})
    h.add_step(float("nan"), 12, 340)
    h.add_step(0.75, 12, 300)
    h.add_eval(2, 0.5, 1.0, {"success": [0.5, 0.5]})
    back = RunHistory.from_dict(h.to_dict())
    assert back.eval == [(0, 0.25), (2, 0.5)] and back.eval_tool_use == [(0, 0.5), (2, 1.0)]
    assert back.eval_first == {"success": [0.0, 0.5]} and back.eval_last == {"success": [0.5, 0.5]}
    assert (back.trajectories, back.tokens) == (24, 640)
    assert math.isnan(back.effective_ratio[0]) and back.effective_ratio[1] == 0.75


def test_an_older_checkpoint_history_without_tool_use_loads():
    old = {"eval": [[0, 0.1]], "effective_ratio": [], "trajectories": 3, "tokens": 9}
    h = RunHistory.from_dict(old)
    assert h.eval == [(0, 0.1)] and h.eval_tool_use == [] and h.eval_first is None
