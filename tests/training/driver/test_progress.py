"""Run reporting: stage timers accumulate per stage; a plotting failure at the end of a run is reported, not raised."""

from __future__ import annotations

import pytest

from trace_gym.training.driver.progress import plot_at_end
from trace_gym.training.step import StageTimer


def test_stage_timer_accumulates_each_stage_and_the_step():
    timer = StageTimer()
    for _ in range(2):
        with timer("rollout"):
            pass
    with timer("update"):
        pass
    m = timer.metrics()
    assert set(m) == {"time/rollout_s", "time/update_s", "time/step_s"}
    assert 0 <= m["time/rollout_s"] <= m["time/step_s"] and 0 <= m["time/update_s"] <= m["time/step_s"]


def test_a_plotting_failure_is_reported_not_raised(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")  # a run folder without rows: plot_run raises ConfigError
    with pytest.warns(RuntimeWarning, match="plots of .* skipped: ConfigError"):
        assert plot_at_end(tmp_path) == []
