"""The figures docs/measured.md gives for torch beside other work come from the committed benchmark data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MEASURED = (ROOT / "docs" / "measured.md").read_text()


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def test_the_processes_table_is_the_threads_benchmark_data():
    data = json.loads((ROOT / "docs" / "data" / "threads_processes.json").read_text())
    rows = {"1 thread": "1-thread", "2 threads (torch's default)": "2-threads",
            "2 processes of 1 thread": "2-processes", "trace-gym's default (2 processes here)": "trace-gym"}
    for label, policy in rows.items():
        cells = data["results"][policy]
        alone, busy, ratio = _range(cells["0"]["rate"]), _range(cells["2"]["rate"]), _range(data["ratios"][policy]["2"])
        section = MEASURED[MEASURED.index("**Processes instead of threads.**"):]
        line = next(row for row in section.splitlines() if row.startswith(f"| {label} |"))
        assert [alone, busy, ratio] == [c.strip(" *") for c in line.split("|")[2:5]], line


@pytest.mark.parametrize("name", ["quickstart_load_processes", "quickstart_load_processes_2"])
def test_the_quickstart_ratio_is_the_load_benchmark_data(name):
    data = json.loads((ROOT / "docs" / "data" / f"{name}.json").read_text())
    idle, busy = data["cells"]["idle"], data["cells"]["busy"]
    assert f"| **{data['busy_over_idle']:.2f}** | {busy['warm_start_s'] / idle['warm_start_s']:.2f} | " \
           f"{busy['rl_s'] / idle['rl_s']:.2f} |" in MEASURED
    for cell in (idle, busy):
        assert f"| {cell['wall_s']:.0f} | {cell['warm_start_s']:.0f} | {cell['rl_s']:.0f} | " \
               f"{cell['success_gain']:+.3f} |" in MEASURED


def test_the_quickstart_runs_with_sft_in_processes_are_the_committed_summaries():
    learning = (ROOT / "docs" / "learning.md").read_text()
    runs = json.loads((ROOT / "docs" / "data" / "quickstart_runs_processes.json").read_text())["runs"]
    for label, run in runs.items():
        line = next(row for row in learning.splitlines() if row.startswith(f"| {label}"))
        cells = [c.strip() for c in line.split("|")[2:-1]]
        before, after = float(cells[0]), float(cells[1])
        assert abs(before - run["success_before"]) < 6e-4 and abs(after - run["success_after"]) < 6e-4, line
        gain = run["gain"]["success"]
        assert cells[2] == f"{gain['mean']:+.3f} [{gain['lo']:+.3f}, {gain['hi']:+.3f}]", line
        assert cells[3] == f"{run['gain']['tool_use']['mean']:+.3f}", line
        assert [int(cells[5]), int(cells[6])] == [round(run["warm_start_s"]), round(run["wall_s"])], line
